"""The decode/verification step replayed as CUDA graphs (runtime.cudagraphs): the bucketed cache prefix and the
static input buffers give the eager forward's results, greedy speculative output equals vanilla output with
graphs, a new cache drops the old cache's graphs. On the CPU the bookkeeping runs without capture
(``capture=False``); the capture itself is tested where CUDA is available."""

import pytest
import torch

from eaglespec.config import GenerationConfig
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import cudagraphs, quant
from eaglespec.runtime.cudagraphs import GraphedStep, graph_step
from eaglespec.runtime.pack import pack_model
from eaglespec.runtime.quant import KernelPlan
from eaglespec.spec.proposer import EagleProposer
from eaglespec.spec.strategies import Chain, DynamicTree
from helpers import tiny_target, tiny_tokenizer
from test_speculative import PROMPTS, make_head

PACKED_ONLY = {f: [(1 << 30, "packed")] for f in quant.FORMATS}


@pytest.fixture
def small_buckets(monkeypatch):
    monkeypatch.setattr(cudagraphs, "PREFIX_BUCKET", 8)  # prompts of 4-12 tokens + 24 new ones cross buckets


def _requests(n_new: int = 24):
    return [Request(tiny_tokenizer().encode(p), GenerationConfig(n_new, ignore_eos=True)) for p in PROMPTS]


def _generate(target, proposer=None, batch: int = 1):
    with torch.inference_mode():
        return [c.token_ids for c in Engine(target, proposer, max_batch_size=batch).generate(_requests())]


@pytest.mark.parametrize("tree", [Chain(3), DynamicTree(topk=3, depth=3, tree_tokens=8)], ids=["chain3", "dynamic"])
def test_graphed_steps_give_the_eager_tokens_and_speculation_stays_lossless(small_buckets, tree):
    target, _ = tiny_target("llama", seed=3)
    pack_model(target.model, "int4", plan=KernelPlan(PACKED_ONLY))  # row-independent attention: exact identity
    eager = _generate(target)
    step = graph_step(target.model, capture=False)
    assert _generate(target) == eager
    assert {key[0] for key in step.graphs} == {(1, 1)}  # vanilla decodes, one graph per bucket
    head = make_head(target, "eagle3")
    assert _generate(target, EagleProposer(head, tree), batch=4) == eager
    assert step.disabled is None
    # (batch, new tokens) and cache slots read: a multiple of the bucket, or the whole cache (max_len slots)
    read = {(key[0], key[1][3], key[2][2] // key[2][3]) for key in step.graphs}
    assert len({slots for _, slots, _ in read}) >= 3
    assert all(slots % 8 == 0 or slots == max_len for _, slots, max_len in read)
    assert (4, tree.num_nodes) in {key[0] for key in step.graphs}  # a full batch's verification forward


def test_stale_slots_inside_the_bucket_are_masked(small_buckets):
    """Slots past a row's committed length hold garbage (an earlier, longer row; rejected tree tokens): the
    bucketed graph reads them and must not attend them."""
    target, _ = tiny_target("llama", seed=5)
    model = target.model
    torch.manual_seed(0)
    tokens = torch.randint(0, model.args.vocab_size, (1, 6))
    outs = []
    with torch.inference_mode():
        for graphed in (False, True):
            model.step_graph = graph_step(model, capture=False) if graphed else None
            cache = model.new_cache(1, 32)
            model(tokens[:, :5], torch.arange(5)[None], cache, prefill=True)
            cache.k[:, :, :, 5:] = 1e3  # garbage in every slot past the prefix
            cache.v[:, :, :, 5:] = -1e3
            cache.lengths[0] = 5
            outs.append(model(tokens[:, 5:], torch.tensor([[5]]), cache, logits_at="all", eager=not graphed))
    # (a first call that disagreed with the eager forward would have been dropped for it: ``disabled`` says so)
    assert model.step_graph.disabled is None
    assert model.step_graph.graphs and next(iter(model.step_graph.graphs))[1][3] == 8  # read 8 slots, 5 committed
    err = ((outs[0].logits - outs[1].logits).norm() / outs[0].logits.norm()).item()
    assert err < 1e-5


def test_the_least_recently_replayed_graphs_are_dropped_beyond_the_cap(small_buckets, monkeypatch):
    monkeypatch.setattr(cudagraphs, "MAX_GRAPHS", 2)
    target, _ = tiny_target("llama", seed=3)
    pack_model(target.model, "int4", plan=KernelPlan(PACKED_ONLY))
    eager = _generate(target)
    step = graph_step(target.model, capture=False)
    assert _generate(target) == eager  # 4-12 prompt tokens + 24 new ones: 3-5 buckets, never more than 2 graphs
    assert len(step.graphs) == 2 and step.disabled is None
    assert max(key[1][3] for key in step.graphs) == list(step.graphs)[-1][1][3]  # the latest bucket, replayed last


def test_a_new_cache_drops_the_old_caches_graphs():
    target, _ = tiny_target("llama", seed=1)
    model = target.model
    step = graph_step(model, capture=False)
    with torch.inference_mode():
        for n in (1, 2):
            cache = model.new_cache(n, 16)
            model(torch.zeros(n, 3, dtype=torch.long), torch.arange(3).expand(n, 3), cache, prefill=True)
            cache.lengths[:] = 3
            model(torch.zeros(n, 1, dtype=torch.long), torch.full((n, 1), 3), cache, logits_at="all")
            assert len(step.graphs) == 1 and next(iter(step.graphs))[0] == (n, 1)


def test_graphs_need_a_cuda_model():
    target, _ = tiny_target("llama")
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device"):
        graph_step(target.model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_graphs_replay_the_eager_forward_on_cuda(small_buckets):
    target, _ = tiny_target("llama", seed=3)
    target.model.to("cuda")
    eager = _generate(target)
    step = graph_step(target.model)
    assert isinstance(step, GraphedStep) and step.capture
    assert _generate(target) == eager
    head = make_head(target, "eagle3").to("cuda")
    assert _generate(target, EagleProposer(head, Chain(3)), batch=4) == eager
    assert step.disabled is None and all(g.graph is not None for g in step.graphs.values())
