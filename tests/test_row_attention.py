"""The row-independent attention kernel (kernels/row_attention.cpp) against float64 attention, and the
property it exists for: a query's output does not depend on the other queries or on slots it cannot see."""

import pytest
import torch

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.model import attention
from eaglespec.spec.tree import tree_mask

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


def _case(batch, n_new, prefix, seed, heads=9, kv_heads=3, dim=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_new, heads, dim, generator=g)
    k = torch.randn(batch, kv_heads, prefix + n_new, dim, generator=g) * 2
    v = torch.randn(batch, kv_heads, prefix + n_new, dim, generator=g)
    return q, k, v


@pytest.mark.parametrize("with_mask", [False, True])
def test_it_matches_float64_attention(with_mask):
    q, k, v = _case(2, 5, 37, seed=0)
    mask = None
    if with_mask:
        mask = torch.rand(2, 1, 5, 42, generator=torch.Generator().manual_seed(1)) > 0.4
        mask[..., 0] = True
    ref = attention(q, k, v, mask, compute_dtype=torch.float64)
    got = attention(q, k, v, mask, exact_rows=True)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_causal_is_top_left_aligned_like_sdpa():
    q, k, v = _case(1, 6, 0, seed=2)
    torch.testing.assert_close(attention(q, k, v, None, is_causal=True, exact_rows=True),
                               attention(q, k, v, None, is_causal=True, compute_dtype=torch.float64),
                               rtol=1e-5, atol=1e-5)


def test_a_verified_tree_token_equals_the_same_token_decoded_alone():
    """Tree of 6 tokens over a 50-token prefix: token i sees the prefix, its ancestors and itself. Decoded
    alone, it sees exactly those slots in a cache that ends at it (no masked slots after it): bit-identical."""
    prefix, parents = 50, [-1, 0, 0, 1, 2, 3]
    q, k, v = _case(1, len(parents), prefix, seed=3)
    n = len(parents)
    block = tree_mask(torch.tensor([parents]), torch.ones(1, n, dtype=torch.bool))[0]  # [N, N] ancestor-or-self
    mask = torch.cat([torch.ones(n, prefix, dtype=torch.bool), block], dim=1)[None, None]
    together = attention(q, k, v, mask, exact_rows=True)
    for i in range(n):
        seen = torch.cat([torch.arange(prefix), prefix + block[i].nonzero()[:, 0]])  # the slots token i sees
        alone = attention(q[:, i : i + 1], k[:, :, seen], v[:, :, seen], None, exact_rows=True)
        assert torch.equal(alone, together[:, i : i + 1]), i


def test_rows_of_a_batch_and_views_of_a_cache_read_in_place():
    q, k, v = _case(3, 2, 20, seed=4)
    cache_k = torch.zeros(5, 3, 40, 64)
    cache_v = torch.zeros(5, 3, 40, 64)
    cache_k[1:4, :, :22], cache_v[1:4, :, :22] = k, v
    got = attention(q, cache_k[1:4, :, :22], cache_v[1:4, :, :22], None, exact_rows=True)  # strided views
    assert torch.equal(got, attention(q, k, v, None, exact_rows=True))
    assert torch.equal(got[1:2], attention(q[1:2], k[1:2], v[1:2], None, exact_rows=True))


def test_a_strided_query_view_is_read_in_place_with_the_same_result():
    """The one-call layer passes q as a transposed view of its projection [B, T, H, D] -> [B, H, T, D]; the
    kernel reads it through its strides (a last dimension that is not contiguous is copied first)."""
    q, k, v = _case(2, 5, 30, seed=8)
    mask = torch.rand(2, 1, 5, 35, generator=torch.Generator().manual_seed(3)) < 0.7
    mask[..., 0] = True
    view = q.transpose(1, 2)  # [B, H, T, D], strided
    assert not view.is_contiguous()
    want = torch.ops.eaglespec.row_attention(view.contiguous(), k, v, mask)
    assert torch.equal(torch.ops.eaglespec.row_attention(view, k, v, mask), want)
    odd = view.transpose(2, 3).contiguous().transpose(2, 3)  # the same values, last dimension strided
    assert odd.stride(3) != 1 and torch.equal(torch.ops.eaglespec.row_attention(odd, k, v, mask), want)
    offset = torch.cat([torch.zeros(2, 5, 1, 64), q], dim=2)[:, :, 1:].transpose(1, 2)  # a view past offset 0
    assert torch.equal(torch.ops.eaglespec.row_attention(offset, k, v, mask), want)


@pytest.mark.parametrize("heads,kv_heads,dim", [
    (9, 3, 64),    # compiled for its shape (head dim 64, 3 query heads per KV head)
    (8, 2, 128),   # compiled, head dim 128
    (12, 1, 64),   # 12 query heads per KV head: the run-time-sized path
    (4, 4, 32),    # head dim 32: the run-time-sized path
])
def test_every_shape_path_matches_float64_and_keeps_tree_tokens_exact(heads, kv_heads, dim):
    """The kernel runs per-shape compiled jobs for common head shapes and a run-time-sized one otherwise: each
    must give float64 attention's values and a tree token's output bit-identical to it decoded alone."""
    prefix, parents = 21, [-1, 0, 0, 2]
    n = len(parents)
    q, k, v = _case(2, n, prefix, seed=5, heads=heads, kv_heads=kv_heads, dim=dim)
    block = tree_mask(torch.tensor([parents]), torch.ones(1, n, dtype=torch.bool))[0]
    mask = torch.cat([torch.ones(n, prefix, dtype=torch.bool), block], dim=1)[None, None]
    together = attention(q, k, v, mask, exact_rows=True)
    torch.testing.assert_close(together, attention(q, k, v, mask, compute_dtype=torch.float64), rtol=1e-5, atol=1e-5)
    for i in range(n):
        seen = torch.cat([torch.arange(prefix), prefix + block[i].nonzero()[:, 0]])
        alone = attention(q[:, i : i + 1], k[:, :, seen], v[:, :, seen], None, exact_rows=True)
        assert torch.equal(alone, together[:, i : i + 1]), i


def _assert_each_query_as_if_alone(q, k, v, mask):
    """Every query of every batch row equals the same query attended alone over exactly the slots it sees."""
    together = attention(q, k, v, mask, exact_rows=True)
    for b in range(q.shape[0]):
        for i in range(q.shape[1]):
            seen = mask[min(b, mask.shape[0] - 1), 0, i].nonzero()[:, 0]
            alone = attention(q[b : b + 1, i : i + 1], k[b : b + 1, :, seen], v[b : b + 1, :, seen], None,
                              exact_rows=True)
            assert torch.equal(alone, together[b : b + 1, i : i + 1]), (b, i)
    return together


@pytest.mark.parametrize("prefix,parents", [
    (100, [-1, 0, 1, 2, 3, 4, 5, 6]),        # a chain of 8 over several 16-slot blocks and value chunks
    (47, [-1, 0, 0, 1, 1, 2, 2, 3, 5, 5]),   # a tree whose shared prefix ends inside a block
    (0, [-1, 0, 1, 0]),                      # no context: the queries share only the root
])
def test_queries_sharing_the_context_read_it_together_yet_stay_exact(prefix, parents):
    """The kernel reads the context every tree token sees once for all of a job's queries: each query must still
    be bit-identical to itself decoded alone, and match float64 attention."""
    n = len(parents)
    q, k, v = _case(2, n, prefix, seed=6)
    block = tree_mask(torch.tensor([parents]), torch.ones(1, n, dtype=torch.bool))[0]
    mask = torch.cat([torch.ones(n, prefix, dtype=torch.bool), block], dim=1)[None, None]
    together = _assert_each_query_as_if_alone(q, k, v, mask)
    torch.testing.assert_close(together, attention(q, k, v, mask, compute_dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_masks_that_part_early_or_differ_per_batch_row_stay_exact():
    """Random per-row masks (lists that part anywhere, even at the first slot) and more queries than one job
    takes (20 > 16): every query as if alone."""
    g = torch.Generator().manual_seed(7)
    q, k, v = _case(2, 20, 60, seed=7)
    mask = torch.rand(2, 1, 20, 80, generator=g) > 0.3
    mask[1, 0, :, :40] = True  # row 1: a long shared prefix, then random
    mask[..., 79] = True       # every query sees at least one slot
    _assert_each_query_as_if_alone(q, k, v, mask)


def test_the_result_does_not_depend_on_the_thread_count():
    """How queries are grouped into jobs follows the thread count; the values must not."""
    prefix, n = 70, 8
    q, k, v = _case(1, n, prefix, seed=8)
    mask = torch.cat([torch.ones(n, prefix, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()], 1)[None, None]
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(attention(q, k, v, mask, exact_rows=True))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_a_packed_models_prompt_attends_with_it_and_matches_the_float64_forward(monkeypatch):
    """Prompt forwards of a packed model attend with the row kernel too (since session 22; the float64 flash kernel
    before, 3.6x slower over 1000 tokens), one call a layer, and the forward matches the same forward with float64
    attention, for one prompt and for a batch of two (the shorter padded)."""
    from helpers import count_kernel_calls, tiny_target

    from eaglespec.runtime.pack import pack_model
    from eaglespec.runtime.quant import KernelPlan

    target, _ = tiny_target("llama")
    model = target.model
    # prompts' projections dense (float32), as a w4a8 model runs prompts of more than 16 tokens: the packed
    # kernel's int8 activations would turn the attentions' last-bit differences into visible ones
    pack_model(model, "int4", plan=KernelPlan({"int4": [(1 << 30, "dense")]}))
    assert model.row_attention
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randint(0, model.args.vocab_size, (n,), generator=g) for n in (11, 16))

    def prefill(tokens):
        rows = torch.arange(tokens.shape[0])
        with torch.inference_mode():
            return model(tokens, torch.arange(tokens.shape[1])[None].expand(len(rows), -1), model.new_cache(2, 32),
                         rows=rows, prefill=True, logits_at="all").logits

    for tokens in (a[None], torch.stack([torch.cat([a, a[:5]]), b])):
        calls = count_kernel_calls(monkeypatch, "row_attention")
        got = prefill(tokens)
        assert len(calls) == model.args.num_hidden_layers
        monkeypatch.undo()
        model.row_attention = False  # the float64 flash kernel, as prompts ran before
        try:
            ref = prefill(tokens)
        finally:
            model.row_attention = True
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
