"""The compiled decode/verification step (runtime.compiled): row-for-row identical across shapes, so that
greedy speculative output equals vanilla output with both compiled; close to the eager forward; and a graph
that disagrees with the eager forward on its first call is dropped, not trusted."""

import pytest
import torch

from eaglespec.config import GenerationConfig
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import compiled, quant
from eaglespec.runtime.compiled import CHECK_RTOL, CompiledStep, compile_step
from eaglespec.runtime.pack import pack_model
from eaglespec.runtime.quant import KernelPlan
from eaglespec.spec.proposer import EagleProposer
from eaglespec.spec.strategies import Chain, DynamicTree
from helpers import assert_block_equals_decodes, tiny_target, tiny_tokenizer
from test_speculative import PROMPTS, make_head

PACKED_ONLY = {f: [(1 << 30, "packed")] for f in quant.FORMATS}


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield


@pytest.fixture(scope="module")
def compiled_int4():
    target, _ = tiny_target("llama", seed=3)
    pack_model(target.model, "int4", plan=KernelPlan(PACKED_ONLY))
    compile_step(target.model)
    return target


def _step_and_eager(model, n_prompt: int, n_new: int):
    """One random prompt of n_prompt tokens prefilled into two one-row caches, then n_new tokens decoded: through
    the model's step graph into the first, eagerly into the second. Returns ((output, cache), (output, cache))."""
    tokens = torch.randint(0, model.args.vocab_size, (1, n_prompt + n_new))
    positions = torch.arange(n_prompt, n_prompt + n_new)[None]
    runs = []
    with torch.inference_mode():
        for eager in (False, True):
            cache = model.new_cache(1, n_prompt + n_new + 4)
            model(tokens[:, :n_prompt], torch.arange(n_prompt)[None], cache, prefill=True)
            cache.lengths[0] = n_prompt
            out = model(tokens[:, n_prompt:], positions, cache, logits_at="all", eager=eager)
            runs.append((out, cache))
    return runs


def _relative_error(a, b):
    return float(((a - b).norm(dim=-1) / a.norm(dim=-1)).max())


@pytest.mark.parametrize("prefix,n_new", [(5, 3), (70, 6)])
def test_compiled_verification_is_bit_identical_to_compiled_decodes(compiled_int4, prefix, n_new):
    model = compiled_int4.model
    torch.manual_seed(prefix)
    tokens = torch.randint(0, model.args.vocab_size, (1, prefix + n_new))
    taps = (1, 3)
    with torch.inference_mode():
        block, caches = assert_block_equals_decodes(model, tokens, prefix, taps)
        eager_cache = model.new_cache(1, prefix + n_new + 1)
        model(tokens[:, :prefix], torch.arange(prefix)[None], eager_cache, prefill=True)
        eager_cache.lengths[0] = prefix
        eager = model(tokens[:, prefix:], torch.arange(prefix, prefix + n_new)[None], eager_cache, logits_at="all",
                      hidden_indices=taps, eager=True)
    assert model.step_graph.disabled is None
    assert _relative_error(eager.logits, block.logits) < CHECK_RTOL
    # the graph's keys and values went into the cache where the eager forward puts them
    written = slice(prefix, prefix + n_new)
    assert _relative_error(eager_cache.k[:, :, :, written], caches[0].k[:, :, :, written]) < CHECK_RTOL
    assert torch.equal(caches[0].k[:, :, :, written], caches[1].k[:, :, :, written])


@pytest.mark.parametrize("tree", [Chain(3), DynamicTree(topk=3, depth=3, tree_tokens=8)], ids=["chain3", "dynamic"])
def test_greedy_speculative_equals_vanilla_both_compiled(compiled_int4, tree):
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(24, ignore_eos=True)) for p in PROMPTS]
    with torch.inference_mode():
        vanilla = [c.token_ids for c in Engine(compiled_int4, max_batch_size=1).generate(reqs)]
        head = make_head(compiled_int4, "eagle3")
        got = Engine(compiled_int4, EagleProposer(head, tree), max_batch_size=4).generate(reqs)
    assert [c.token_ids for c in got] == vanilla
    step = compiled_int4.model.step_graph
    assert step.disabled is None
    assert {(batch1, one) for batch1, one, *_ in step._checked} == {(True, True), (True, False), (False, False)}


def test_a_graph_that_disagrees_on_its_first_call_is_dropped_for_the_eager_forward(monkeypatch):
    target, _ = tiny_target("llama", seed=5)
    model = target.model
    step = CompiledStep(model)

    def wrong(*args):  # what a miscompiled graph would return: the right shapes, wrong values
        hidden, aux, logits, k, v = compiled._step_graph(*args)
        return hidden + 1.0, aux, logits.flip(-1), k + 1.0, v
    monkeypatch.setattr(step, "_graph", wrong)
    model.step_graph = step
    torch.manual_seed(0)
    (got, got_cache), (ref, ref_cache) = _step_and_eager(model, 10, 2)
    assert step.disabled is not None and "disagreed" in step.disabled
    assert torch.equal(got.logits, ref.logits) and torch.equal(got_cache.k, ref_cache.k)
    assert not step.handles(1, None, "all")  # from now on everything runs eager


def test_only_decode_and_verification_forwards_take_the_graph(monkeypatch):
    target, _ = tiny_target("llama")
    step = CompiledStep(target.model)
    assert step.handles(1, None, "all") and step.handles(4, torch.ones(1, 4, 4, dtype=torch.bool), None)
    assert not step.handles(2, torch.ones(1, 2, 5, dtype=torch.bool), "all")  # block wider than the new tokens
    assert not step.handles(1, None, torch.zeros(1, 1, dtype=torch.long))  # logits at chosen rows
    calls = []
    monkeypatch.setattr(CompiledStep, "__call__", lambda self, *a, **k: calls.append(a[0].shape))
    target.model.step_graph = step
    with torch.inference_mode():
        cache = target.model.new_cache(1, 8)
        target.model(torch.zeros(1, 3, dtype=torch.long), torch.arange(3)[None], cache, prefill=True)
        assert not calls  # prompt forwards stay eager
        target.model(torch.zeros(1, 1, dtype=torch.long), torch.tensor([[3]]), cache, logits_at="all")
    assert calls == [torch.Size([1, 1])]


def _graphs() -> int:
    return len(torch._dynamo.eval_frame._debug_get_cache_entry_list(compiled._step_graph.__code__))


def test_rows_joining_leaving_or_gathered_do_not_compile_new_graphs(compiled_int4):
    """A batch's rows change as requests finish and join: contiguous or scattered rows, fewer rows, one row
    left in a batch cache. Once the batch cache's two graphs (one token, several) exist, none of that may
    compile another (each compile is 1-2 minutes on the default model mid-generation)."""
    model = compiled_int4.model
    vocab = model.args.vocab_size
    torch.manual_seed(7)
    cache = model.new_cache(4, 64)
    with torch.inference_mode():
        model(torch.randint(0, vocab, (4, 5)), torch.arange(5)[None].expand(4, 5), cache, prefill=True)
        cache.lengths[:] = 5

        def step(rows, n_new, block=None):
            rows_t = torch.tensor(rows)
            pos = cache.lengths[rows_t][:, None] + torch.arange(n_new)[None]
            tokens = torch.randint(0, vocab, (len(rows), n_new))
            out = model(tokens, pos, cache, rows=rows_t, block_mask=block, logits_at="all")
            cache.lengths[rows_t] += n_new
            return tokens, pos, out

        step([0, 1, 2, 3], 1)
        step([0, 1, 2, 3], 3)
        before = _graphs()
        step([0, 1, 2], 1)  # contiguous rows, fewer
        step([0, 1, 3], 1)  # scattered rows (gathered)
        step([1, 3], 3)
        step([3], 3, torch.ones(1, 3, 3, dtype=torch.bool).tril())
        snapshot = cache.k.clone()
        tokens, pos, out = step([2], 1)  # one row left in a batch cache
        assert _graphs() == before
        assert model.step_graph.disabled is None
        # the lone row ran twice in the batch graph; only its own new slot was written
        changed = (cache.k != snapshot).any(dim=(0, 2, 4)).nonzero().tolist()  # [row, slot] pairs
        assert changed and all(row == 2 and slot == int(pos[0, 0]) for row, slot in changed)
        cache.lengths[2] -= 1
        ref = model(tokens, pos, cache, rows=torch.tensor([2]), logits_at="all", eager=True)
    assert _relative_error(ref.logits, out.logits) < CHECK_RTOL


def test_a_graph_that_fails_to_compile_falls_back_to_eager(monkeypatch):
    target, _ = tiny_target("llama", seed=6)
    model = target.model
    step = CompiledStep(model)

    def broken(*args):
        raise RuntimeError("inductor: C++ compile failed\nlong log")
    monkeypatch.setattr(step, "_graph", broken)
    model.step_graph = step
    (got, got_cache), (ref, ref_cache) = _step_and_eager(model, 5, 1)
    assert step.disabled == "the compiled step failed (RuntimeError: inductor: C++ compile failed)"
    assert torch.equal(got.logits, ref.logits) and torch.equal(got_cache.k, ref_cache.k)
