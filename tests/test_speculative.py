"""Speculative decoding through the one generation loop: greedy identity, replay acceptance, batching."""

import pytest
import torch

from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.generate import Engine, Request
from eaglespec.heads import DraftHead
from eaglespec.proposer import EagleProposer, ReplayProposer
from eaglespec.tree import EAGLE1_TREE_PATHS, TreeConfig, TreeDispatcher
from helpers import tiny_target, tiny_tokenizer

PROMPTS = ["The quick brown fox", "def add(a, b):", "1 2 3 4 5 6", "Café, naïve", "Speculative decoding"]
TREES = {
    "chain4": TreeConfig.chain(4),
    "static": TreeConfig.static(EAGLE1_TREE_PATHS),
    "dynamic": TreeConfig.dynamic(topk=3, depth=4, tree_tokens=10),
}


@pytest.fixture(scope="module")
def tiny():
    target, _ = tiny_target("llama")
    return target


@pytest.fixture(scope="module")
def vanilla(tiny):
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(40, ignore_eos=True)) for p in PROMPTS]
    return reqs, [c.token_ids for c in Engine(tiny, max_batch_size=4).generate(reqs)]


def make_head(target, kind, layers=1, seed=0):
    torch.manual_seed(seed)
    kw = {"draft_vocab_size": 96} if kind == "eagle3" else {}
    head = DraftHead.for_target(target.model, kind, num_layers=layers, **kw)
    if kind == "eagle3":
        head.set_draft_vocab(torch.randperm(target.model.args.vocab_size)[:96])
    return head.eval()


@pytest.mark.parametrize("kind,layers", [("eagle1", 1), ("eagle3", 1), ("eagle3", 2)])
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_speculative_equals_vanilla(tiny, vanilla, kind, layers, tree, batch):
    reqs, expected = vanilla
    proposer = EagleProposer(make_head(tiny, kind, layers), TREES[tree])
    with torch.inference_mode():
        got = Engine(tiny, proposer, max_batch_size=batch).generate(reqs)
    assert [c.token_ids for c in got] == expected
    for c in got:
        st = c.stats
        assert st.target_forwards < st.new_tokens  # at least the prefill token is free
        assert sum(st.accepted_per_position[:1]) <= st.target_forwards


@pytest.mark.parametrize("alignment", ["stable", "last"])
@pytest.mark.parametrize("tree", list(TREES))
def test_alignment_schemes_keep_greedy_identity(tiny, vanilla, alignment, tree):
    reqs, expected = vanilla
    proposer = EagleProposer(make_head(tiny, "eagle3"), TREES[tree], alignment=alignment)
    with torch.inference_mode():
        got = Engine(tiny, proposer, max_batch_size=2).generate(reqs)
    assert [c.token_ids for c in got] == expected


def test_dispatcher_changes_tree_with_batch(tiny, vanilla):
    reqs, expected = vanilla
    table = TreeDispatcher({1: TREES["dynamic"], 2: TREES["static"], 3: TreeConfig.chain(2)})
    proposer = EagleProposer(make_head(tiny, "eagle1"), table)
    with torch.inference_mode():
        got = Engine(tiny, proposer, max_batch_size=4).generate(reqs)
    assert [c.token_ids for c in got] == expected


@pytest.mark.parametrize("depth", [1, 3, 5])
@pytest.mark.parametrize("batch", [1, 3])
def test_replay_drafter_gets_everything_accepted(tiny, vanilla, depth, batch):
    reqs, expected = vanilla
    steps = 6
    n = 1 + steps * (depth + 1)  # prefill token + `steps` full rounds
    reqs = [Request(r.prompt_ids, GenerationConfig(n, ignore_eos=True)) for r in reqs]
    replay = ReplayProposer({tuple(r.prompt_ids): e for r, e in zip(reqs, expected)}, depth)
    got = Engine(tiny, replay, max_batch_size=batch).generate(reqs)
    for c, e in zip(got, expected):
        assert c.token_ids == e[:n]
        assert c.stats.target_forwards == steps
        assert c.stats.mean_accept_len == depth + 1
        assert c.stats.accepted_per_position == [steps] * depth


def test_stop_inside_a_multi_token_commit_truncates_exactly(tiny, vanilla):
    reqs, expected = vanilla
    replay = ReplayProposer({tuple(r.prompt_ids): e for r, e in zip(reqs, expected)}, 5)
    # budget ends mid-chunk
    got = Engine(tiny, replay).generate([Request(reqs[0].prompt_ids, GenerationConfig(9, ignore_eos=True))])[0]
    assert got.token_ids == expected[0][:9] and got.finish_reason == "length"
    # EOS mid-chunk: declare the 5th token an EOS id
    eos_tok = expected[0][4]
    first = expected[0].index(eos_tok)
    t2 = type(tiny)(**{**vars(tiny), "eos_token_ids": [eos_tok]})
    got = Engine(t2, replay).generate([Request(reqs[0].prompt_ids, GenerationConfig(40))])[0]
    assert got.token_ids == expected[0][: first + 1] and got.finish_reason == "stop"
    assert got.stats.new_tokens == first + 1


def test_seeded_speculative_sampling_repeats(tiny):
    ids = tiny_tokenizer().encode(PROMPTS[0])
    cfg = GenerationConfig(30, SamplingParams(temperature=0.8, top_k=20, seed=7), ignore_eos=True)
    proposer = EagleProposer(make_head(tiny, "eagle3"), TREES["dynamic"])
    with torch.inference_mode():
        a = Engine(tiny, proposer).generate([Request(ids, cfg)])[0].token_ids
        b = Engine(tiny, proposer).generate([Request(ids, cfg)])[0].token_ids
    assert a == b and len(a) == 30
