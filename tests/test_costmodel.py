"""The speculative cost model: expected tokens from acceptance, speedup from measured costs, the choice of
tree (``none`` for a head that is never accepted, a deep chain for a drafter that always is), and cached
calibration."""

import pytest

from eaglespec.spec.costmodel import AcceptanceTracker, CostTable, chain_expected_tokens, choose, predicted_speedup


def flat_costs(verify_1=0.010, per_token=0.0005, draft_per_level=0.001, batches=(1, 4)):
    verify = {(b, n): verify_1 * b ** 0.5 + per_token * n * b for b in batches for n in (1, 2, 4, 8, 16)}
    draft = {(b, f"chain{d}"): draft_per_level * d for b in batches for d in range(1, 7)}
    return CostTable(verify, draft)


CHAINS = {f"chain{d}": (d + 1, d) for d in range(1, 7)}


def test_chain_expected_tokens_by_hand():
    assert chain_expected_tokens([0.5, 0.4, 0.2], 3) == pytest.approx(1 + 0.5 + 0.2 + 0.04)
    assert chain_expected_tokens([0.5], 3) == pytest.approx(1.5)  # unmeasured depths count as never accepted
    assert chain_expected_tokens([1.0] * 5, 5) == 6.0


def test_cost_table_interpolates_and_extrapolates_along_tokens():
    t = CostTable({(1, 1): 1.0, (1, 4): 4.0, (2, 1): 10.0}, {})
    assert t.verify_cost(1, 2) == pytest.approx(2.0)
    assert t.verify_cost(1, 8) == pytest.approx(8.0)  # beyond the last measured n: linear in n
    assert t.verify_cost(3, 1) == 10.0  # nearest measured batch at or below


def test_never_accepted_head_picks_none():
    tracker = AcceptanceTracker(prior=(0.0,) * 6)
    for _ in range(20):
        tracker.update_chain(3, 0)
    choice = choose(flat_costs(), 1, CHAINS, tracker)
    assert choice.label == "none" and choice.predicted_speedup == 1.0


def test_always_accepted_drafter_picks_a_deep_chain():
    tracker = AcceptanceTracker(prior=(1.0,) * 6)
    for _ in range(20):
        tracker.update_chain(6, 6)
    choice = choose(flat_costs(), 1, CHAINS, tracker)
    assert choice.label == "chain6"
    expected = 7 * 0.0105 / (0.006 + 0.010 + 0.0005 * 7)  # E[tokens] * verify(1) / (draft + verify(7))
    assert choice.predicted_speedup == pytest.approx(expected)


def test_expensive_verification_at_batch_size_turns_speculation_off():
    # at batch 4 every token in the tree costs as much as the whole batch's decode: nothing pays at 50%
    costs = CostTable({(4, n): 0.02 * n for n in (1, 2, 4, 8)}, {(4, f"chain{d}"): 0.001 * d for d in range(1, 7)})
    tracker = AcceptanceTracker(prior=(0.5,) * 6)
    assert choose(costs, 4, CHAINS, tracker).label == "none"
    assert predicted_speedup(costs, 4, "chain1", 2, 1.5) == pytest.approx(1.5 * 0.02 / (0.001 + 0.04))


def test_tracker_counts_the_first_miss_and_decays():
    t = AcceptanceTracker(decay=1.0, prior=(), weight=0.0)
    t.update_chain(4, 2)  # depths 1, 2 accepted, 3 tried and missed, 4 not tried
    t.update_chain(4, 0)  # depth 1 missed
    assert t.rates()[:3] == [0.5, 1.0, 0.0] and len(t.tries) == 3
    d = AcceptanceTracker(decay=0.5, prior=(1.0,), weight=1.0)
    d.update_chain(1, 0)
    assert d.rates()[0] == pytest.approx(0.5 / 1.5)  # prior weight halved, one miss added
    d.update_shape("dyn", 3.0)
    d.update_shape("dyn", 1.0)
    assert d.expected_tokens("dyn", 4) == pytest.approx((3.0 * 0.5 + 1.0) / 1.5)
    with pytest.raises(ValueError, match="decay"):
        AcceptanceTracker(decay=0.0)


def test_calibration_is_cached_and_reused(tmp_path, monkeypatch):
    import torch

    from eaglespec.engine import calibrate as cal
    from eaglespec.spec.proposer import EagleProposer
    from eaglespec.spec.strategies import Chain
    from helpers import tiny_target
    from test_speculative import make_head

    target, _ = tiny_target("llama")
    head = make_head(target, "eagle3")
    cands = {"chain1": Chain(1), "chain3": Chain(3)}
    monkeypatch.setattr(cal, "VERIFY_TOKENS", (1, 2, 4))
    monkeypatch.setattr(cal, "PREFIX", 16)
    with torch.inference_mode():
        table, measured = cal.load_or_calibrate(target, lambda t: EagleProposer(head, t), cands, tmp_path,
                                                head_id="h", batches=(1, 2))
    assert measured and set(table.verify) == {(b, n) for b in (1, 2) for n in (1, 2, 4)}
    assert set(table.draft) == {(b, c) for b in (1, 2) for c in cands} and all(v > 0 for v in table.draft.values())

    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured again")))
    again, measured = cal.load_or_calibrate(target, None, cands, tmp_path, head_id="h", batches=(1, 2))
    assert not measured and again.verify == table.verify and again.draft == table.draft
    with pytest.raises(AssertionError, match="measured again"):  # another head is another calibration
        cal.load_or_calibrate(target, None, cands, tmp_path, head_id="other", batches=(1, 2))


def _greedy_runs(target, proposer, prompts, n=32):
    import torch

    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request

    reqs = [Request(p, GenerationConfig(n, ignore_eos=True)) for p in prompts]
    with torch.inference_mode():
        return [c.token_ids for c in Engine(target, proposer, max_batch_size=2).generate(reqs)]


def test_adaptive_dispatch_is_deterministic_and_greedy_identical():
    from eaglespec.spec.dispatch import AdaptiveDispatcher
    from eaglespec.spec.proposer import EagleProposer
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    prompts = [tiny_tokenizer().encode(p) for p in PROMPTS]
    vanilla = _greedy_runs(target, None, prompts)
    costs = flat_costs(batches=(1, 2))
    runs, picks = [], []
    for _ in range(2):
        d = AdaptiveDispatcher(costs, repick_every=2, probe_every=3)
        seen = []
        orig = d.pick
        d.pick = lambda b, rows=None: seen.append(orig(b, rows)) or seen[-1]
        runs.append(_greedy_runs(target, EagleProposer(make_head(target, "eagle3"), d), prompts))
        picks.append([c.label for c in seen])
    assert runs[0] == vanilla and runs[1] == vanilla
    assert picks[0] == picks[1]  # same choices step by step
    # a random head is (almost) never accepted: the dispatcher mostly stops drafting and probes
    assert picks[0].count("none") > len(picks[0]) / 2 and any(p.startswith("chain") for p in picks[0])
