"""Speculative decoding through the one generation loop: greedy identity, replay acceptance, batching."""

import pytest
import torch

from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.engine.generate import Engine, Request
from eaglespec.spec.heads import DraftHead
from eaglespec.spec.proposer import EagleProposer, ReplayProposer
from eaglespec.spec.strategies import Chain, DynamicTree, NoDraft, StaticTree, TreeDispatcher
from helpers import tiny_target, tiny_tokenizer

PROMPTS = ["The quick brown fox", "def add(a, b):", "1 2 3 4 5 6", "Café, naïve", "Speculative decoding"]
TREES = {
    "chain4": Chain(4),
    "static": StaticTree(),  # the EAGLE-1 reference tree
    "dynamic": DynamicTree(topk=3, depth=4, tree_tokens=10),
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


def test_engine_steps_record_no_autograd_graph_under_grad_mode(tiny, vanilla):
    """A library caller that never turned autograd off: the head (parameters requiring grad, as built for
    training) must not record its ops or copy its KV cache each forward, and the output stays vanilla's."""
    reqs, expected = vanilla
    head = make_head(tiny, "eagle3")
    assert all(p.requires_grad for p in head.parameters())
    proposer = EagleProposer(head, TREES["chain4"])
    seen = []
    forward = head.forward

    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        seen.append((torch.is_grad_enabled(), out.requires_grad, proposer.cache.k))
        return out

    head.forward = spy
    assert torch.is_grad_enabled()
    got = Engine(tiny, proposer, max_batch_size=2).generate(reqs)
    assert [c.token_ids for c in got] == expected
    assert seen and not any(grad or tracked for grad, tracked, _ in seen)
    caches = {id(k) for _, _, k in seen}
    assert len(caches) == 1  # one cache tensor throughout: no clone per forward


@pytest.mark.parametrize("alignment", ["stable", "last"])
@pytest.mark.parametrize("tree", list(TREES))
def test_alignment_schemes_keep_greedy_identity(tiny, vanilla, alignment, tree):
    reqs, expected = vanilla
    proposer = EagleProposer(make_head(tiny, "eagle3"), TREES[tree], alignment=alignment)
    with torch.inference_mode():
        got = Engine(tiny, proposer, max_batch_size=2).generate(reqs)
    assert [c.token_ids for c in got] == expected


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("depth,alignment", [(1, "stable"), (1, "last"), (3, "stable")])
def test_chain_commits_leave_the_draft_state_of_the_general_commit(tiny, vanilla, depth, alignment, batch,
                                                                   monkeypatch):
    """Chains re-encode their accepted pairs by slicing (``_commit_chain``; at batch 1 every row accepts alike,
    so its pairs are one slice and their last output a view); the general commit gathers them by node. Both
    must draft the same trees afterwards, step for step, at batch 1 and with rows of unequal acceptance side by
    side."""
    reqs, expected = vanilla
    current = {}  # batch 1: the request being decoded (its prompt length and vanilla output)

    def drafted(general):
        proposer = EagleProposer(make_head(tiny, "eagle3"), Chain(depth), alignment=alignment)
        taken, uniform = [], []
        if general:
            monkeypatch.setattr(proposer, "_commit_chain", proposer._commit_tree)
        else:
            chain_commit, append = proposer._commit_chain, proposer._append_pairs
            monkeypatch.setattr(proposer, "_commit_chain", lambda *a: (taken.append(1), chain_commit(*a)))
            monkeypatch.setattr(proposer, "_append_pairs",
                                lambda *a, **k: (uniform.append(k.get("uniform")), append(*a, **k)))
        propose, trees = proposer.propose, []

        def recorded(*args, **kwargs):
            tree = propose(*args, **kwargs)
            trees.append(tree.tokens.tolist())
            if batch == 1:  # the random head is never right: the first len(trees) % (depth + 1) nodes made right
                n, want = kwargs["host"].lengths[0] - current["prompt"], current["output"]
                for i in range(1, min(len(trees) % (depth + 1), len(want) - n - 1) + 1):
                    tree.tokens[0, i] = want[n + i]
            return tree

        monkeypatch.setattr(proposer, "propose", recorded)
        with torch.inference_mode():
            engine = Engine(tiny, proposer, max_batch_size=batch)
            if batch == 1:
                for r, want in zip(reqs, expected):
                    current.update(prompt=len(r.prompt_ids), output=want)
                    assert engine.generate([r])[0].token_ids == want
            else:
                engine.generate(reqs)
        return trees, len(taken), uniform

    got, chain_calls, uniform = drafted(general=False)
    want, _, _ = drafted(general=True)
    assert chain_calls > 0 and got == want
    if batch == 1 and alignment == "stable":  # the one-slice path ran, with more than one accepted length
        assert None not in uniform and len(set(uniform)) > 1, sorted(set(uniform))


def test_dispatcher_changes_tree_with_batch(tiny, vanilla):
    reqs, expected = vanilla
    table = TreeDispatcher({1: TREES["dynamic"], 2: TREES["static"], 3: Chain(2)})
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
        assert c.stats.tau == depth + 1
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


def test_dispatcher_can_pause_speculation_and_resume(tiny, vanilla):
    """A 'none' entry decodes plainly at large batch; as rows finish the batch shrinks and drafting resumes. The
    draft state must follow every committed token meanwhile: encoded or recorded pairs cover the target cache
    after every step (one pair per target position), the draft cache alone after every drafting step (the
    prompt's and the paused pairs were caught up), and greedy output stays identical."""
    reqs, expected = vanilla
    budgets = [40, 8, 10, 12, 9]
    table = TreeDispatcher({1: Chain(3), 2: NoDraft()})
    proposer = EagleProposer(make_head(tiny, "eagle3"), table)
    engine = Engine(tiny, proposer, max_batch_size=5, max_len=128)
    out = {i: [] for i in range(5)}
    for i, (r, n) in enumerate(zip(reqs, budgets)):
        engine.submit(i, Request(r.prompt_ids, GenerationConfig(n, ignore_eos=True)))
    batch_sizes, labels = [], []
    propose = proposer.propose
    proposer.propose = lambda *a, **k: labels.append(proposer.dispatcher.pick(a[0].numel()).label) or propose(*a, **k)
    with torch.inference_mode():
        while not engine.idle:
            labels.clear()
            for c in engine.step():
                out[c.index] += c.token_ids
            rows = torch.tensor([s.row for s in engine.active], dtype=torch.long)
            batch_sizes.append(len(rows))
            assert torch.equal(proposer.covered_lengths(rows), engine.cache.lengths[rows])
            if labels and labels[0] != "none":  # a drafting step (not a prefill, not paused)
                assert torch.equal(proposer.cache.lengths[rows], engine.cache.lengths[rows])
    assert 1 in batch_sizes and 5 in batch_sizes  # both the paused and the drafting regime ran
    assert [out[i] for i in range(5)] == [e[:n] for e, n in zip(expected, budgets)]


@pytest.mark.parametrize("tree", ["chain4", "static"])
def test_default_draft_temperature_is_each_requests_own(tiny, tree):
    """draft_temperature None (the default): in one batch, a sampled request drafts exactly as with its own
    temperature fixed (same tokens, same acceptance: its children are drawn at its T from its own generator),
    and a greedy request exactly as with top-k children (its output is vanilla's)."""
    tok = tiny_tokenizer()
    sampled = Request(tok.encode(PROMPTS[1]), GenerationConfig(30, SamplingParams(temperature=0.8, seed=7),
                                                               ignore_eos=True))
    greedy = Request(tok.encode(PROMPTS[2]), GenerationConfig(30, SamplingParams(temperature=0.0), ignore_eos=True))
    head = make_head(tiny, "eagle3")
    with torch.inference_mode():
        mixed = Engine(tiny, EagleProposer(head, TREES[tree]), max_batch_size=2).generate([sampled, greedy])
        fixed = Engine(tiny, EagleProposer(head, TREES[tree], draft_temperature=0.8)).generate([sampled])[0]
        top_k = Engine(tiny, EagleProposer(head, TREES[tree], draft_temperature=0.0)).generate([greedy])[0]
        vanilla = Engine(tiny, None).generate([greedy])[0]
    assert mixed[0].token_ids == fixed.token_ids and len(fixed.token_ids) == 30
    assert mixed[0].stats.accepted_per_position == fixed.stats.accepted_per_position
    assert mixed[1].token_ids == top_k.token_ids == vanilla.token_ids
    assert mixed[1].stats.accepted_per_position == top_k.stats.accepted_per_position
    # the two rules differ for the sampled request (else this test could not tell them apart)
    with torch.inference_mode():
        greedy_drafts = Engine(tiny, EagleProposer(head, TREES[tree], draft_temperature=0.0)).generate([sampled])[0]
    assert (greedy_drafts.token_ids, greedy_drafts.stats.accepted_per_position) != \
        (fixed.token_ids, fixed.stats.accepted_per_position)


@pytest.mark.parametrize("tree", ["chain4", "static"])
def test_sampled_drafts_of_a_row_do_not_depend_on_its_batch(tiny, tree):
    """--draft-temperature > 0: each row samples its drafts from a generator derived from its own seed, so a
    seeded request gives the same tokens (and the same acceptance) alone and inside a batch of others."""
    tok = tiny_tokenizer()

    def request(i: int) -> Request:
        sampling = SamplingParams(temperature=0.8, top_k=20, seed=100 + i)
        return Request(tok.encode(PROMPTS[i]), GenerationConfig(30, sampling, ignore_eos=True))

    head = make_head(tiny, "eagle3")
    with torch.inference_mode():
        alone = Engine(tiny, EagleProposer(head, TREES[tree], draft_temperature=0.7)).generate([request(2)])[0]
        batch = Engine(tiny, EagleProposer(head, TREES[tree], draft_temperature=0.7), max_batch_size=4).generate(
            [request(i) for i in range(4)])
    inside = batch[2]
    assert inside.token_ids == alone.token_ids and len(alone.token_ids) == 30
    assert inside.stats.accepted_per_position == alone.stats.accepted_per_position
    assert inside.stats.target_forwards == alone.stats.target_forwards


@pytest.mark.parametrize("batch", [1, 3])
def test_a_paused_engine_samples_vanillas_tokens(tiny, batch):
    """At T > 0 a speculative engine that drafts nothing (``none`` at every batch size it meets) takes each step's bonus
    uniform from the stream vanilla decoding takes it from, whatever its slack: the same tokens, request for
    request. Once it drafts, the acceptance tests draw from a stream of their own and its tokens part from
    vanilla's (lossless in distribution, not token for token)."""
    tok = tiny_tokenizer()
    reqs = [Request(tok.encode(p), GenerationConfig(30, SamplingParams(temperature=0.9, top_p=0.95, seed=40 + i),
                                                    ignore_eos=True)) for i, p in enumerate(PROMPTS[:3])]
    head = make_head(tiny, "eagle3")
    with torch.inference_mode():
        plain = Engine(tiny, None, max_batch_size=batch).generate(reqs)
        paused_engine = Engine(tiny, EagleProposer(head, TreeDispatcher({1: NoDraft(), 8: Chain(4)})), max_batch_size=batch)
        paused = paused_engine.generate(reqs)
        drafting = Engine(tiny, EagleProposer(head, TREES["chain4"]), max_batch_size=batch).generate(reqs)
    assert paused_engine.slack > 1  # its slack is not vanilla's: the streams must not hang on it
    assert [c.token_ids for c in paused] == [c.token_ids for c in plain]
    assert all(len(c.token_ids) == 30 for c in plain)
    assert [c.token_ids for c in drafting] != [c.token_ids for c in plain]
