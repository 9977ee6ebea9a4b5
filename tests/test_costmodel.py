"""The speculative cost model: expected tokens from acceptance, speedup from measured costs, the choice of
tree (``none`` for a head that is never accepted, a deep chain for a drafter that always is), and cached
calibration."""

import math
import random
from types import SimpleNamespace

import pytest

from eaglespec.spec.costmodel import AcceptanceTracker, CostTable, chain_expected_tokens, choose, predicted_speedup
from eaglespec.spec.strategies import Chain


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


def test_remembered_prices_are_the_prices_and_a_derived_table_prices_afresh():
    """verify_cost remembers each (batch, n) on first use (the dispatcher asks every step): asked in any order, or
    again, it gives what a fresh table gives; a table derived from it (the sampled one) prices with its own
    overhead, not the remembered one."""
    def table():
        return CostTable({(1, 1): 0.010, (1, 4): 0.016, (4, 1): 0.030, (4, 2): 0.040}, {}, overhead={1: 0.001, 4: 0.002},
                         context={(1, 1): 1e-5, (1, 4): 3e-5}, prefix=100, sampled_overhead={1: 0.005})
    asks = [(1, 1, None), (1, 2, 300.0), (3, 2, None), (4, 8, 50.0), (9, 1, 200.0), (1, 6, 0.0), (1, 1, 250.0)]
    fresh = [table().verify_cost(b, n, c) for b, n, c in asks]
    used = table()
    assert [used.verify_cost(b, n, c) for b, n, c in asks] == fresh
    assert [used.verify_cost(b, n, c) for b, n, c in reversed(asks)] == fresh[::-1]
    assert fresh[0] == pytest.approx(0.011) and fresh[1] == pytest.approx(0.012 + 0.001 + (1e-5 + 2e-5 / 3) * 200)
    assert fresh[2] == pytest.approx(0.012 + 0.001)  # batch 3 priced at batch 1, the nearest measured below
    assert used.for_sampled().verify_cost(1, 1) == pytest.approx(0.015)


def test_engine_overhead_is_paid_by_every_step_and_can_flip_the_choice():
    # Bare forwards: a 2-node chain costs 1.2x a plain step plus 1 ms of drafting; accepted 30% of the time it
    # breaks even (1.3 * 10 / 13 = 1.0) and is not chosen. The engine adds 3 ms to every step, drafting or not
    # (verification, sampling, the host read): 1.3 * 13 / 16 = 1.056, and the chain pays.
    verify = {(1, 1): 0.010, (1, 2): 0.012, (1, 4): 0.015}
    bare = CostTable(verify, {(1, "chain1"): 0.001})
    engine = CostTable(verify, {(1, "chain1"): 0.001}, overhead={1: 0.003})
    assert engine.verify_cost(1, 1) == pytest.approx(0.013) and engine.verify_cost(1, 3) == pytest.approx(0.0165)
    assert predicted_speedup(bare, 1, "chain1", 2, 1.3) == pytest.approx(1.3 * 10 / 13)
    assert predicted_speedup(engine, 1, "chain1", 2, 1.3) == pytest.approx(1.3 * 13 / 16)
    tracker = AcceptanceTracker()
    for i in range(100):
        tracker.update_chain(1, int((i + 1) * 0.3) - int(i * 0.3))  # accepted 3 of every 10, spread evenly
    assert tracker.rates()[0] == pytest.approx(0.30, abs=0.02)
    cands = {"chain1": (2, 1)}
    assert choose(bare, 1, cands, tracker, margin=1.02).label == "none"
    assert choose(engine, 1, cands, tracker, margin=1.02).label == "chain1"


def test_a_stalled_measurement_does_not_make_speculation_look_free():
    # verify(2, 1) caught a stall of the shared machine: 4.8 s where its neighbours took ~65 ms. Uncapped,
    # a chain at batch 2 would be predicted ~30x faster than plain decoding and always chosen.
    verify = {(b, n): 0.050 + 0.005 * b + 0.004 * n * b for b in (1, 2, 4) for n in (1, 2, 4, 8)}
    verify[(2, 1)] = 4.8
    costs = CostTable(verify, {(b, "chain1"): 0.002 for b in (1, 2, 4)})
    assert costs.verify[(2, 1)] == 4.8  # the raw measurement is kept (printed, cached) ...
    assert costs.verify_cost(2, 1) == pytest.approx(verify[(2, 2)])  # ... the model uses the capped one
    assert costs.verify_cost(1, 1) == pytest.approx(verify[(1, 1)])  # consistent measurements are untouched
    assert costs.stalled() == [(2, 1)]  # what calibration measures again before it keeps the table
    assert CostTable({k: v for k, v in verify.items() if k != (2, 1)} | {(2, 1): 0.07}, {}).stalled() == []


def test_calibration_measures_a_stalled_point_again(monkeypatch):
    from eaglespec.engine import calibrate as cal
    from helpers import tiny_target

    target, _ = tiny_target("llama")
    real, calls = cal._time_rounds, []

    def stall_first(fns, warmup=1, **kw):  # the first round of batch 1 reads verify(1, 1) in a 5 s stall
        calls.append(list(fns))
        got = real(fns, warmup, **kw)
        return {**got, (16, 1, 1): 5.0} if len(calls) == 1 else got

    monkeypatch.setattr(cal, "_time_rounds", stall_first)
    verify = cal.measure_verify(target.model, batches=(1, 2), tokens=(1, 2, 4), prefix=16)
    # each batch size's forwards in one set of rounds, then verify(1, 1) again (and any other point this
    # machine's noise stalled)
    assert calls[:2] == [[(16, 1, n) for n in (1, 2, 4)], [(16, 2, n) for n in (1, 2, 4)]]
    assert (16, 1, 1) in calls[2]
    assert verify[(1, 1)] < 5.0


def test_calibration_measures_again_a_point_read_slightly_above_a_larger_forward(monkeypatch):
    """A stall that reads verify(1, 2) at 1.1x verify(1, 4) (under ``stalled``'s 1.2 for a table) is measured
    again, not kept capped at verify(1, 4) (which priced the chain of 1 too high and paused a run on the Xeon)."""
    from eaglespec.engine import calibrate as cal
    from helpers import tiny_target

    target, _ = tiny_target("llama")
    calls = []
    rounds = [{1: 1.0, 2: 4.4, 4: 4.0}, {2: 2.0}]  # ms: the batch's rounds (verify(1, 2) stalled), then (1, 2) again

    def timed(fns, warmup=1, **kw):
        calls.append(list(fns))
        return {k: rounds[len(calls) - 1][k[2]] * 1e-3 for k in fns}

    monkeypatch.setattr(cal, "_time_rounds", timed)
    verify = cal.measure_verify(target.model, batches=(1,), tokens=(1, 2, 4), prefix=16)
    assert calls == [[(16, 1, 1), (16, 1, 2), (16, 1, 4)], [(16, 1, 2)]]
    assert verify == {(1, 1): 1e-3, (1, 2): 2e-3, (1, 4): 4e-3}


def test_forwards_are_timed_in_rounds_so_a_burst_spoils_one_reading_of_each(monkeypatch):
    """A burst of load over four consecutive calls: timed in rounds (every forward once a round) it hits one
    reading of each forward and the quickest reading is the quiet one; timed one forward after another (until
    calibration version 18) it hit all the readings of one, which priced verify(1, 2) 10% high on the EPYC."""
    from eaglespec.engine import calibrate as cal

    clock, log = [0.0], []

    def forward(name, cost):
        def run():
            log.append(name)
            clock[0] += cost * (3.0 if 4 <= len(log) <= 7 else 1.0)  # calls 4-7 run 3x slower
        return run

    monkeypatch.setattr(cal.time, "perf_counter", lambda: clock[0])
    got = cal._time_rounds({"a": forward("a", 0.001), "b": forward("b", 0.002)}, warmup=1, rounds=3, max_rounds=3)
    assert log == ["a", "b"] * 4  # a warm-up round, then three rounds
    assert got == pytest.approx({"a": 0.001, "b": 0.002})
    # the budget: more rounds (up to max_rounds) while they take under budget_s per function
    log.clear()
    cal._time_rounds({"a": forward("a", 0.001)}, warmup=0, rounds=2, max_rounds=5, budget_s=1.0)
    assert len(log) == 5
    log.clear()
    cal._time_rounds({"a": forward("a", 0.6)}, warmup=0, rounds=1, max_rounds=5, budget_s=1.0)
    assert len(log) == 2  # 0.6 s, then 1.2 s (or more) spent: over the budget


def test_a_one_token_forward_is_never_priced_above_a_plain_step(monkeypatch):
    """calibrate(): a 1-token forward that read slower than the median plain engine step holding it (as the
    compiled one did: 5.65 ms against ~4.9) is priced at the step, with no overhead on top; consistent
    readings are kept."""
    from eaglespec.engine import calibrate as cal

    verify = {(1, 1): 0.00565, (1, 2): 0.0066, (2, 1): 0.008, (2, 2): 0.009}
    monkeypatch.setattr(cal, "measure_verify_and_context", lambda model, batches: (dict(verify), {}))
    def plain_steps(target, batches, temperature=0.0, beyond=None):  # the steps less their forwards
        beyond.update({1: 0.0009, 2: 0.0009} if temperature else {1: 0.0007, 2: 0.0007})
        return {1: 0.0049 + (0.0004 if temperature else 0.0), 2: 0.0085 + (0.0006 if temperature else 0.0)}

    monkeypatch.setattr(cal, "measure_plain_steps", plain_steps)
    monkeypatch.setattr(cal, "measure_draft", lambda *a, temperature=0.0, **k: {
        (1, "chain1"): 0.0015 if temperature else 0.001, (2, "chain1"): 0.001})
    monkeypatch.setattr(cal, "measure_paused", lambda *a, **k: {1: 0.0, 2: 0.0})
    monkeypatch.setattr(cal, "_fingerprint", lambda: "test")
    table = cal.calibrate(SimpleNamespace(model=None), None, {"chain1": Chain(1)}, batches=(1, 2))
    assert table.verify[(1, 1)] == pytest.approx(0.0049) and table.overhead[1] == 0.0
    assert table.verify_cost(1, 1) == pytest.approx(0.0049)  # the plain step as measured, not 5.65 ms
    assert table.verify[(2, 1)] == pytest.approx(0.008) and table.overhead[2] == pytest.approx(0.0005)
    assert table.verify[(1, 2)] == pytest.approx(0.0066)  # larger forwards are not touched
    # sampled requests: their plain step over the same (capped) forward, at most the steps less their own
    # forwards (1.1 ms from the steps at batch 2, 0.9 beyond the forwards), their own drafting
    assert table.sampled_overhead == pytest.approx({1: 0.0004, 2: 0.0009})
    sampled = table.for_sampled()
    assert sampled.verify_cost(1, 1) == pytest.approx(0.0053) and sampled.draft_cost(1, "chain1") == 0.0015
    assert table.verify_cost(1, 1) == pytest.approx(0.0049) and table.draft_cost(1, "chain1") == 0.001
    again = cal._from_json(cal._to_json(table))
    assert again.sampled_overhead == pytest.approx(table.sampled_overhead)
    assert again.sampled_draft == pytest.approx(table.sampled_draft)
    steps = {1: 0.004}
    v = {(1, 1): 0.003, (1, 2): 0.005}
    assert cal.cap_by_plain_steps(v, steps) == [] and v[(1, 1)] == 0.003


def test_a_sampled_tree_step_is_priced_no_cheaper_against_plain_than_its_greedy_step():
    """``for_sampled(nodes)``: a tree whose sampled reading prices its step at fewer sampled plain steps than its
    greedy step costs greedy plain steps is raised to the greedy ratio (session 37's calibration: the sampled chain
    of 1 at 1.27 plain steps, the greedy at 1.35); a sampled reading above it stays; without ``nodes``, or for a
    tree not named in it, the readings stand as measured."""
    from eaglespec.spec.costmodel import CostTable

    verify = {(1, 1): 0.0040, (1, 2): 0.0042, (1, 4): 0.0046}
    table = CostTable(verify, {(1, "chain1"): 0.0012, (1, "chain3"): 0.0020}, overhead={1: 0.0},
                      sampled_overhead={1: 0.0004}, sampled_draft={(1, "chain1"): 0.0008, (1, "chain3"): 0.0030})
    greedy = {label: (table.draft_cost(1, label) + table.verify_cost(1, n)) / table.verify_cost(1, 1)
              for label, n in (("chain1", 2), ("chain3", 4))}
    assert greedy["chain1"] == pytest.approx(1.35)

    def ratio(t, label, n):
        return (t.draft_cost(1, label) + t.verify_cost(1, n)) / t.verify_cost(1, 1)

    raw = table.for_sampled()
    assert ratio(raw, "chain1", 2) == pytest.approx((0.0008 + 0.0046) / 0.0044)  # 1.23: as measured
    floored = table.for_sampled({"chain1": 2, "chain3": 4})
    assert ratio(floored, "chain1", 2) == pytest.approx(greedy["chain1"])
    assert floored.draft_cost(1, "chain3") == 0.0030  # 1.82 sampled against 1.65 greedy: kept
    assert floored.verify_cost(1, 1) == pytest.approx(0.0044)  # the sampled plain step is not touched
    assert table.for_sampled({"chain3": 4}).draft_cost(1, "chain1") == 0.0008  # not named: as measured


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


def test_a_memory_of_each_depth_ages_only_as_that_depth_is_tried():
    """``keep_untried``: a verification ages only the depths it tried (the first miss and those before it), a
    look-back only depth 1; without it every depth ages, tried or not."""
    t = AcceptanceTracker(prior=(0.5, 0.4), weight=8)
    t.update_chain(1, 1, keep_untried=True)  # a chain of 1: depth 2 not tried
    t.update_chain(2, 0, keep_untried=True)  # the first token missed: depth 2 not tried
    assert t.hits[1] == 3.2 and t.tries[1] == 8.0
    assert t.tries[0] == pytest.approx(8 * 0.97 ** 2 + 0.97 + 1) and t.hits[0] == pytest.approx(4 * 0.97 ** 2 + 0.97)
    t.update_chain(2, 1, keep_untried=True)  # depth 2 tried and missed
    assert (t.hits[1], t.tries[1]) == pytest.approx((3.2 * 0.97, 8 * 0.97 + 1))
    depth2 = (t.hits[1], t.tries[1])
    t.update_first(3, 4, keep_untried=True)
    assert (t.hits[1], t.tries[1]) == depth2
    aging = AcceptanceTracker(prior=(0.5, 0.4), weight=8)
    aging.update_chain(1, 1)
    aging.update_first(3, 4)
    assert aging.tries[1] == pytest.approx(8 * 0.97 ** 5) and aging.rates()[1] == pytest.approx(0.4)


def test_paired_steps_step_a_drafting_and_a_plain_engine_in_turns(monkeypatch):
    """Calibration's ``_paired_steps``: a drafting engine and a plain one decode the same requests, one step
    each in turn while both have work, and each step is timed on its own (prefill and two steps left out)."""
    import torch

    from eaglespec.config import GenerationConfig
    from eaglespec.engine import calibrate as cal
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.proposer import ReplayProposer
    from helpers import tiny_target

    target, _ = tiny_target("llama")
    prompt = list(range(5, 21))
    with torch.inference_mode():  # the continuation a replay drafter gets fully accepted (3 tokens a step)
        want = Engine(target).generate([Request(prompt, GenerationConfig(12, ignore_eos=True))])[0].token_ids
    replay = ReplayProposer({tuple(prompt): want}, depth=2)
    order, step = [], Engine.step

    def logged(self, on_finish=None):
        order.append(self.proposer is None)
        return step(self, on_finish)

    monkeypatch.setattr(Engine, "step", logged)
    with torch.inference_mode():
        tree, plain, stats = cal._paired_steps(target, replay, 2, 12, prompt)
    # plain: a prefill and 11 one-token steps; drafting: a prefill and ceil(11 / 3) steps
    assert len(plain) == 12 - 3 and len(tree) == 5 - 3 and stats.target_forwards == 4
    assert order == [False, True] * 5 + [True] * 7  # in turns while both run, then the plain one alone
    assert all(t > 0 for t in tree + plain)


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
    # a tiny model's steps are all Python: on a loaded machine its table can look stalled and go uncached
    # (tested below); this test is about the cache
    monkeypatch.setattr(cal.CostTable, "implausible", lambda self: [])
    with torch.inference_mode():
        table, measured = cal.load_or_calibrate(target, lambda t: EagleProposer(head, t), cands, tmp_path,
                                                head_id="h", batches=(1, 2))
    assert measured and set(table.verify) == {(b, n) for b in (1, 2) for n in (1, 2, 4)}
    assert set(table.draft) == {(b, c) for b in (1, 2) for c in cands} and all(v > 0 for v in table.draft.values())

    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured again")))
    again, measured = cal.load_or_calibrate(target, None, cands, tmp_path, head_id="h", batches=(1, 2))
    assert set(table.overhead) == {1, 2} and all(v >= 0 for v in table.overhead.values())
    assert not measured and again.verify == table.verify and again.draft == table.draft
    assert again.overhead == table.overhead
    with pytest.raises(AssertionError, match="measured again"):  # another head is another calibration
        cal.load_or_calibrate(target, None, cands, tmp_path, head_id="other", batches=(1, 2))


def test_a_calibration_taken_under_load_is_measured_again_and_never_cached(tmp_path, monkeypatch):
    from eaglespec.engine import calibrate as cal

    good = flat_costs()
    good.overhead = {1: 0.0005, 4: 0.001}
    assert good.implausible() == []
    busy = flat_costs()
    busy.overhead = {1: 0.0, 4: 1.03}  # a second of bookkeeping a step: the machine stalled
    assert any("overhead" in d and "batch 4" in d for d in busy.implausible())
    slow_chain = flat_costs()
    slow_chain.draft[(1, "chain2")] = 0.030  # 15 ms a level against 1 ms for the other chains
    assert any("chain2" in d for d in slow_chain.implausible())
    noisy_pause = flat_costs()
    v1 = noisy_pause.envelope[(1, 1)]
    noisy_pause.paused = {1: max(0.11 * v1, 0.0011)}  # read 1.1 ms against a 10 ms forward on a noisy machine
    assert any("paused step" in d and "batch 1" in d for d in noisy_pause.implausible())
    noisy_pause.paused = {1: min(0.04 * v1, 0.0004)}  # bookkeeping: a few percent at most
    assert noisy_pause.implausible() == []
    noisy_pause.paused = {1: 0.0002, 4: 0.15 * noisy_pause.envelope[(4, 1)]}  # a pair per row: not judged at 4
    assert noisy_pause.implausible() == []

    cands = {"chain1": Chain(1)}
    target = type("T", (), {"name": "m"})()
    tables = iter([busy, slow_chain, busy, good])
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: next(tables))
    table, measured = cal.load_or_calibrate(target, None, cands, tmp_path, head_id="h", batches=(1, 4))
    assert table is slow_chain and measured and not list(tmp_path.rglob("*.json"))  # stalled twice: used, not kept
    table, measured = cal.load_or_calibrate(target, None, cands, tmp_path, head_id="h", batches=(1, 4))
    assert table is good and measured and len(list(tmp_path.rglob("*.json"))) == 1  # measured once more, kept


def test_the_head_is_calibrated_as_it_runs():
    # `eaglespec calibrate` once timed a float32 head while decoding ran it in int8 (2-3x cheaper) under the
    # same cache key, so the dispatcher saw drafting at 3x its cost. Both now load through load_draft_head,
    # and the head's precision is part of the key.
    from eaglespec.engine.calibrate import head_precision
    from eaglespec.runtime.pack import pack_linears
    from helpers import tiny_target
    from test_speculative import make_head

    target, _ = tiny_target("llama")
    head = make_head(target, "eagle3")
    assert head_precision(head) == "float32"
    pack_linears(head, "int8")
    assert head_precision(head) == "int8"
    from eaglespec.runtime import cpu_kernels

    if cpu_kernels.available():
        other = make_head(target, "eagle3")
        pack_linears(other, "int4", kernel="w4a8")
        assert head_precision(other) == "int4/w4a8"


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
        d = AdaptiveDispatcher(costs, repick_every=2, probe_every=3, cost_feedback=False)  # choices from acceptance
        seen = []
        orig = d.pick
        d.pick = lambda b, rows=None, context=None, **kw: seen.append(orig(b, rows, context, **kw)) or seen[-1]
        runs.append(_greedy_runs(target, EagleProposer(make_head(target, "eagle3"), d), prompts))
        picks.append([c.label for c in seen])
    assert runs[0] == vanilla and runs[1] == vanilla
    assert picks[0] == picks[1]  # same choices step by step
    # a random head is (almost) never accepted: the dispatcher drafts on its prior, then mostly pauses
    assert picks[0].count("none") > len(picks[0]) / 2 and any(p.startswith("chain") for p in picks[0])


def test_predicted_speedup_adds_up_rounds_not_ratios():
    from eaglespec.engine.stats import SequenceStats
    from eaglespec.spec.costmodel import Choice

    plain = Choice("none", 1.0, 1.0, 0.010)
    chain = Choice("chain3", 3.0 * 0.010 / 0.020, 3.0, 0.020)
    assert plain.vanilla_s == pytest.approx(0.010) and chain.vanilla_s == pytest.approx(0.010)
    a, b = SequenceStats(), SequenceStats()
    for st, choices in ((a, [plain, chain]), (b, [chain, chain])):
        for c in choices:
            st.record_accepted(int(c.expected_tokens) - 1)
            st.record_tree(c.label, c)
    assert a.tree_rounds == {"none": 1, "chain3": 1}
    # 4 tokens in 0.030 s against 2 plain tokens in 0.020 s (the mean of the two ratios, 1.25, would not
    # compare with a measured tokens/s ratio)
    assert a.predicted_speedup == pytest.approx((4 / 0.030) / (2 / 0.020))
    pooled = SequenceStats.pooled([a, b])
    assert pooled.tree_rounds == {"none": 1, "chain3": 3}
    assert pooled.predicted_speedup == pytest.approx((10 / 0.070) / (4 / 0.040))
    again = SequenceStats.from_record({"target_forwards": 2, **a.dispatch_record()})
    assert again.predicted_speedup == pytest.approx(a.predicted_speedup) and again.tree_rounds == a.tree_rounds
    fixed = SequenceStats()
    fixed.record_tree("chain2")  # a fixed tree: counted, no prediction
    assert fixed.tree_rounds == {"chain2": 1} and fixed.predicted_speedup is None
    assert fixed.dispatch_record()["predicted_speedup"] is None


def test_engine_stats_count_the_chosen_trees_and_their_predictions():
    import torch

    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.dispatch import AdaptiveDispatcher
    from eaglespec.spec.proposer import EagleProposer
    from eaglespec.spec.strategies import Chain
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    prompts = [tiny_tokenizer().encode(p) for p in PROMPTS[:2]]
    # the tiny model's steps cost nothing like the hand-made prices: choices from acceptance alone
    d = AdaptiveDispatcher(flat_costs(batches=(1, 2)), repick_every=2, probe_every=3, cost_feedback=False)
    steps = []  # per step: the tree the proposer drafted and the dispatcher's prediction for it
    head = make_head(target, "eagle3")
    proposer = EagleProposer(head, d)
    orig = proposer.propose

    def propose(*a, **kw):
        tree = orig(*a, **kw)
        steps.append((proposer.step_label, d.step))
        return tree

    proposer.propose = propose
    reqs = [Request(p, GenerationConfig(24, ignore_eos=True)) for p in prompts]
    with torch.inference_mode():
        done = Engine(target, proposer, max_batch_size=2).generate(reqs)
    assert {label for label, _ in steps} >= {"none", "chain1"}  # drafted (the cheapest chain), then paused
    assert all(label == c.label for label, c in steps)  # each step's prediction is for the tree it ran
    for c in done:  # both rows ran every step together
        st = c.stats
        assert st.tree_rounds == {k: sum(1 for label, _ in steps if label == k) for k, _ in steps}
        assert sum(st.tree_rounds.values()) == st.target_forwards == len(steps)
        tokens = sum(ch.expected_tokens for _, ch in steps)
        secs = sum(ch.step_s for _, ch in steps)
        plain = sum(ch.vanilla_s for _, ch in steps)
        assert st.predicted_speedup == pytest.approx((tokens / secs) / (len(steps) / plain))
    with torch.inference_mode():  # a fixed tree: counted, nothing predicted
        fixed = Engine(target, EagleProposer(head, Chain(2))).generate(reqs[:1])[0].stats
    assert fixed.tree_rounds == {"chain2": fixed.target_forwards} and fixed.predicted_speedup is None


# ------------------------------------------------------------------------------------------- paused state
class Scripted:
    """A tree dispatcher that runs a fixed sequence of trees, one per step (the last one repeats)."""

    def __init__(self, script):
        self.script, self.i = script, 0
        self.configs = list(dict.fromkeys(script))

    def pick(self, batch_size):
        cfg = self.script[min(self.i, len(self.script) - 1)]
        self.i += 1
        return cfg


def test_lazy_catch_up_drafts_what_encoding_every_paused_step_drafts(monkeypatch):
    """A paused step only records its pair; the catch-up (when drafting resumes, a probe drafts, or the buffer
    is full) must leave the draft state exactly as encoding the pairs step by step does (max_lag=0): the same
    trees, token for token, with the same draft probabilities, on ragged rows that join and leave mid-pause,
    with a buffer that grows (from 2 pairs a row, doubling) while the pause lasts."""
    import torch

    from eaglespec.spec import proposer as prop

    monkeypatch.setattr(prop, "LAG_CHUNK", 2)

    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.proposer import EagleProposer
    from eaglespec.spec.strategies import Chain, DynamicTree, NoDraft
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    none, chain3 = NoDraft(), Chain(3)
    script = ([none] * 10 + [chain3] * 2 + [none] * 3 + [DynamicTree(topk=3, depth=3, tree_tokens=8)]
              + [none] * 9 + [Chain(2)] + [none] * 7 + [chain3])
    # the second request finishes 3 steps into the first pause and the third takes its row: ragged lags; the
    # fourth joins after drafting has run, so that one catch-up meets a waiting prompt and a caught-up row
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(n, ignore_eos=True))
            for p, n in zip(PROMPTS, (40, 4, 12, 20))]
    head = make_head(target, "eagle3")
    runs = []
    # encode every step; catch up when drafting resumes; also when 4 pairs wait; and from step 5 on without the
    # engine's host rows (paused pairs then recorded by the device's counts alone)
    for max_lag, host_until in ((0, None), (16, None), (4, None), (16, 5)):
        proposer = EagleProposer(head, Scripted(script), max_lag=max_lag)
        trees = []
        orig = proposer.propose

        def propose(*a, _orig=orig, _trees=trees, _until=host_until, **k):
            if _until is not None and len(_trees) >= _until:
                k["host"] = None
            _trees.append(_orig(*a, **k))
            return _trees[-1]

        proposer.propose = propose
        with torch.inference_mode():
            done = Engine(target, proposer, max_batch_size=2).generate(reqs)
        runs.append(([c.token_ids for c in done], trees))
    (eager_out, eager), *lazy_runs = runs
    for lazy_out, lazy in lazy_runs:
        assert lazy_out == eager_out and len(lazy) == len(eager) > len(script)
        drafted = 0
        for a, b in zip(eager, lazy):
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
            torch.testing.assert_close(a.draft_logp, b.draft_logp, rtol=0, atol=1e-5)
            drafted += a.tokens.shape[1] > 1
        assert drafted >= 5  # drafting resumed after pauses of 10, 3, 9 and 7 steps


def test_a_catch_up_after_a_paused_request_left_reads_within_the_buffer(monkeypatch):
    """Requests one after another in one row: the first pauses to its end (its recorded pairs leave with it),
    the next pauses for fewer steps and then drafts. It must draft what encoding every step drafts, and its
    catch-up encode its own pairs only (the bound of the paused steps dropped when the first request left: it
    once stayed, and at batch 4 padded every row of a catch-up to 619 pairs where the rows had 111)."""
    import torch

    from eaglespec.spec import proposer as prop

    monkeypatch.setattr(prop, "LAG_CHUNK", 2)

    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.proposer import EagleProposer
    from eaglespec.spec.strategies import Chain, NoDraft
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    script = [NoDraft()] * 11 + [Chain(2)]  # the first request's 6 steps, then 5 paused steps of the second
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(n, ignore_eos=True))
            for p, n in zip(PROMPTS, (7, 20))]
    head = make_head(target, "eagle3")
    runs = []
    encoded, bounds = [], []  # pairs a row of each catch-up forward; paused steps bounded before each step
    for max_lag in (0, 64):
        proposer = EagleProposer(head, Scripted(script), max_lag=max_lag)
        trees = []
        orig = proposer.propose
        proposer.propose = lambda *a, _o=orig, _t=trees, **k: _t.append(_o(*a, **k)) or _t[-1]
        if max_lag:
            enc = proposer._encode
            proposer._encode = lambda rows, feats, *a, _e=enc: encoded.append(feats.shape[1]) or _e(rows, feats, *a)
            proposer.propose = lambda *a, _o=proposer.propose, _p=proposer, **k: bounds.append(_p._lag_bound) or \
                _o(*a, **k)
        with torch.inference_mode():
            engine = Engine(target, proposer, max_batch_size=1)
            done = [c.token_ids for c in engine.generate(reqs)]  # one row: one request after the other
        runs.append((done, [t.tokens for t in trees]))
    assert runs[0][0] == runs[1][0]
    assert len(runs[0][1]) == len(runs[1][1]) and all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert sum(t.shape[1] > 1 for t in runs[1][1]) >= 5
    # the bound left with the first request: the second's catch-up encodes its prompt and its own 5 pairs
    assert encoded == [len(reqs[1].prompt_ids) + 5]
    assert bounds[:12] == [0, 1, 2, 3, 4, 5] + [0, 1, 2, 3, 4, 5]  # the first request's 6 steps, the second's


def test_a_look_back_scores_a_row_that_just_joined_in_a_forward_of_its_own():
    """A look-back whose catch-up puts a request that just joined (its prompt waiting, no pair recorded yet) in a
    head forward of its own, as wide as its prompt: nothing of it is scored (it once gathered one slot past the
    forward's end and raised, seen at batch 4 on MT-bench), the other row is, and greedy output is vanilla's."""
    import torch

    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.proposer import EagleProposer
    from eaglespec.spec.strategies import NoDraft
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    class LookingBack(Scripted):
        look_back_due = False

        def pick(self, batch_size):
            self.look_back_due = self.i == 2  # the first step after the long prompt joined
            return super().pick(batch_size)

        def observe_look_back(self, rows, hits, tries):
            seen.append(dict(zip(rows, tries)))

    target, _ = tiny_target("llama")
    tok = tiny_tokenizer()
    # the second request leaves after 2 steps and a long prompt takes its row
    reqs = [Request(tok.encode(p), GenerationConfig(n, ignore_eos=True))
            for p, n in ((PROMPTS[0], 12), (PROMPTS[1], 3), (PROMPTS[4] * 8, 4))]
    seen = []
    with torch.inference_mode():
        got = Engine(target, EagleProposer(make_head(target, "eagle3"), LookingBack([NoDraft()])),
                     max_batch_size=2).generate(reqs)
        want = Engine(target, None, max_batch_size=2).generate(reqs)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    # row 1 holds the long prompt, nothing recorded; row 0 scored its one pair whose next token is known
    assert seen == [{0: 1, 1: 0}] and len(reqs[2].prompt_ids) > len(reqs[0].prompt_ids) + 2 + 16


def test_a_catch_up_groups_its_rows_into_forwards_for_the_fewest_padded_pairs():
    """``plan_catch_up`` against every partition of the rows (forwards padded to their longest row, a fixed cost
    each): the optimum among sorted runs is the optimum; rows with nothing to encode are left out."""
    import itertools
    import random

    from eaglespec.spec.proposer import catch_up_cost, plan_catch_up

    def cost(groups, widths, fixed):
        return sum(len(g) * max(widths[b] for b in g) + fixed for g in groups)

    assert catch_up_cost([[2], [0, 1]], [5, 7, 3], fixed=16) == 3 + 16 + 2 * 7 + 16

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for p in partitions(rest):
            yield [[first], *p]
            for i in range(len(p)):
                yield [*p[:i], [first, *p[i]], *p[i + 1:]]

    assert plan_catch_up([249, 418, 70, 89], fixed=16) == [[2], [3], [0], [1]]  # the batch of the docstring
    assert plan_catch_up([249, 418, 70, 89], fixed=32) == [[2, 3], [0], [1]]
    assert plan_catch_up([40, 40, 40], fixed=16) == [[0, 1, 2]]
    assert plan_catch_up([0, 5, 0], fixed=16) == [[1]] and plan_catch_up([0, 0]) == []
    assert plan_catch_up([10, 400], fixed=1000) == [[0, 1]]  # a dear forward: one padded forward
    rng = random.Random(0)
    for _ in range(200):
        widths = [rng.choice([0, rng.randint(1, 30), rng.randint(1, 500)]) for _ in range(rng.randint(1, 6))]
        fixed = rng.choice([0, 16, 100])
        groups = plan_catch_up(widths, fixed)
        assert sorted(itertools.chain(*groups)) == [b for b, w in enumerate(widths) if w > 0]
        assert all(g == sorted(g) for g in groups)
        best = min((cost(p, widths, fixed) for p in partitions([b for b, w in enumerate(widths) if w > 0])),
                   default=0)
        assert cost(groups, widths, fixed) == best


def test_paused_dispatch_keeps_greedy_identity_and_seeded_sampling_repeats():
    """Adaptive dispatch with a head that is never right: mostly paused (lazy), probing now and then. Greedy
    tokens equal vanilla's; a seeded sampling run repeats token for token."""
    import torch

    from eaglespec.config import GenerationConfig, SamplingParams
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.dispatch import AdaptiveDispatcher
    from eaglespec.spec.proposer import EagleProposer
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    prompts = [tiny_tokenizer().encode(p) for p in PROMPTS[:3]]

    def run(sampling, proposer):
        reqs = [Request(p, GenerationConfig(40, sampling, ignore_eos=True)) for p in prompts]
        with torch.inference_mode():
            return [c.token_ids for c in Engine(target, proposer, max_batch_size=2).generate(reqs)]

    def spec():
        return EagleProposer(make_head(target, "eagle3"), AdaptiveDispatcher(flat_costs(batches=(1, 2)),
                                                                             repick_every=2, probe_every=5,
                                                                             cost_feedback=False))

    greedy = SamplingParams(temperature=0.0)
    assert run(greedy, spec()) == run(greedy, None)
    hot = SamplingParams(temperature=1.0, seed=7)
    first = run(hot, spec())
    assert run(hot, spec()) == first
    assert run(SamplingParams(temperature=1.0, seed=8), spec()) != first  # the seed matters


@pytest.mark.parametrize("max_lag", [1024, 7])
def test_quiet_runs_skip_picks_but_change_no_choice(max_lag):
    """A proposer that takes the dispatcher's quiet runs for granted (paused steps without a pick:
    ``AdaptiveDispatcher.quiet_run``) drafts the same trees, looks back at the same steps, decodes the same tokens
    and leaves the dispatcher's counters where one that asks at every step leaves them, with fewer picks; rows
    that join and leave, probes falling due, contexts entering another bucket and (``max_lag`` 7) a full lag
    buffer end a run."""
    import torch

    from eaglespec.config import GenerationConfig, SamplingParams
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.dispatch import CONTEXT_BUCKET, AdaptiveDispatcher
    from eaglespec.spec.proposer import EagleProposer
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    prompts = [tiny_tokenizer().encode(p) for p in PROMPTS[:3]]
    assert max(map(len, prompts)) < CONTEXT_BUCKET < min(map(len, prompts)) + 90  # each crosses a bucket's edge
    reqs = [Request(p, GenerationConfig(90, SamplingParams(temperature=1.0, seed=i), ignore_eos=True))
            for i, p in enumerate(prompts)]

    def run(quiet: bool):
        # chain 1 pays above ~58% depth-1 acceptance: mostly paused, looking back now and then; every context
        # token adds to a step's price, so each choice's prediction differs from one context bucket to the next
        flat = flat_costs(per_token=0.01, batches=(1, 2))
        d = AdaptiveDispatcher(CostTable(flat.verify, flat.draft, context={k: 1e-5 for k in flat.verify}),
                               repick_every=2, probe_every=5, cost_feedback=False)
        if not quiet:
            d.quiet_run = lambda: 0
        proposer = EagleProposer(make_head(target, "eagle3"), d, max_lag=max_lag)
        picks, trace, counters = [0], [], []
        pick, propose, look, timed = d.pick, proposer.propose, d.observe_look_back, d.observe_catch_up
        d.observe_catch_up = lambda pairs, seconds: timed(pairs, 2e-5 * pairs)  # a probe's price without a clock
        d.pick = lambda *a, **k: picks.__setitem__(0, picks[0] + 1) or pick(*a, **k)
        d.observe_look_back = lambda *a, **k: trace.append("look-back") or look(*a, **k)

        def traced(*a, **k):
            tree = propose(*a, **k)
            trace.append((proposer.step_label, d.step))
            return tree

        proposer.propose = traced
        engine = Engine(target, proposer, max_batch_size=2)
        with torch.inference_mode():
            out = [c.token_ids for c in engine.generate(reqs)]
        proposer._settle_quiet()
        counters.append((d._steps, d._since_draft, d._probe_wait))
        return out, trace, counters, picks[0]

    asked, quiet = run(False), run(True)
    assert quiet[:3] == asked[:3]
    labels = [t[0] for t in asked[1] if t != "look-back"]
    assert "look-back" in asked[1] and labels.count("none") > len(labels) // 2  # mostly paused, looking back
    assert asked[3] == len(labels) and quiet[3] < asked[3] // 2  # most paused steps asked nothing


def test_a_quiet_run_is_as_long_as_the_picks_it_vouches_for():
    """``quiet_run`` after a pause: the steps before the next probe falls due or the context enters the next
    bucket, whichever comes first; none after a drafting pick; ``skip_quiet`` refuses more than that."""
    from eaglespec.spec.dispatch import CONTEXT_BUCKET, AdaptiveDispatcher

    d = AdaptiveDispatcher(flat_costs(per_token=0.01), repick_every=1, probe_every=8, cost_feedback=False)
    d.start_row(0)
    assert not d.pick(1, [0], context=10.0).drafts and d.quiet_run() == 6  # picks 2-7; the 8th probes
    d.skip_quiet(3)
    assert d.quiet_run() == 3
    with pytest.raises(ValueError, match="skip_quiet: 4 steps"):
        d.skip_quiet(4)
    d.skip_quiet(3)
    d.pick(1, [0], context=17.0)
    assert d._probe_wait == 16 and d.quiet_run() == 0  # the 8th pick: its probe was due (the next wait doubled)
    e = AdaptiveDispatcher(flat_costs(per_token=0.01), repick_every=1, probe_every=256, max_probe_every=256,
                           cost_feedback=False)
    e.start_row(0)
    # contexts 61.5, 62.5 and 63.5 follow in its bucket; 64.5 is in the next one
    assert not e.pick(1, [0], context=CONTEXT_BUCKET - 3.5).drafts and e.quiet_run() == 3
    cheap = AdaptiveDispatcher(flat_costs(), cost_feedback=False, prior=AcceptanceTracker(prior=(0.9,) * 8))
    cheap.start_row(0)
    assert cheap.pick(1, [0], context=10.0).drafts and cheap.quiet_run() == 0


def test_a_sampled_request_drafts_on_a_larger_predicted_gain_and_pauses_sooner():
    """A request alone that samples starts drafting at a predicted ``SAMPLED_MARGIN`` (a greedy one at ``margin``)
    and pauses below ``SAMPLED_KEEP_MARGIN`` (a greedy one below ``KEEP_MARGIN``), its acceptance sinking as every
    draft is rejected; out-of-range settings are refused."""
    from eaglespec.spec.dispatch import KEEP_MARGIN, SAMPLED_KEEP_MARGIN, SAMPLED_MARGIN, AdaptiveDispatcher

    def trace(sampled: bool, rate: float) -> list[tuple[str, float]]:
        d = AdaptiveDispatcher(flat_costs(), repick_every=1, cost_feedback=False, spread_prior=False, deepen_steps=0,
                               probe_every=1000, max_probe_every=1000)
        d.pools[sampled] = AcceptanceTracker(prior=(rate,) * 8, weight=20.0)
        d.start_row(0, sampled)
        out = []
        for _ in range(40):
            cfg = d.pick(1, [0], context=10.0)
            out.append((cfg.label, d.last.predicted_speedup))
            if cfg.drafts:
                d.observe([0], cfg, [0])
        return out

    assert trace(False, 0.19)[0] == ("chain1", pytest.approx(1.041, abs=1e-3))  # a greedy request drafts at 1.04x
    assert trace(True, 0.19)[0][0] == "none" and trace(True, 0.21)[0][0] == "none"  # a sampled one not below 1.06x
    greedy, sampled = trace(False, 0.25), trace(True, 0.25)  # 1.09x at the start, then sinking
    assert greedy[0][0] == sampled[0][0] == "chain1" and SAMPLED_MARGIN <= sampled[0][1]
    assert any(label == "chain1" and KEEP_MARGIN <= p < 1.0 for label, p in greedy)
    assert all(p >= SAMPLED_KEEP_MARGIN for label, p in sampled if label == "chain1") and sampled[-1][0] == "none"
    assert sum(label == "chain1" for label, _ in sampled) < sum(label == "chain1" for label, _ in greedy)
    for bad in ({"sampled_margin": 0.99}, {"sampled_keep_margin": 0.0}, {"sampled_keep_margin": 1.2}):
        with pytest.raises(ValueError, match="sampled_margin must be >= 1"):
            AdaptiveDispatcher(flat_costs(), **bad)


def test_paused_steps_run_no_head_forward_and_resuming_runs_one_more():
    """What makes the paused state cheap: no draft-head forward at prefill (the prompt's pairs wait) or while
    paused; the step that resumes drafting runs exactly one extra forward (the catch-up over the prompts' and
    all recorded pairs) compared with the next drafting step."""
    import torch

    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.proposer import EagleProposer
    from eaglespec.spec.strategies import Chain, NoDraft
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    head = make_head(target, "eagle3")
    calls = []
    head.register_forward_hook(lambda *_: calls.append(1))
    proposer = EagleProposer(head, Scripted([NoDraft()] * 10 + [Chain(2)] * 3))
    engine = Engine(target, proposer, max_batch_size=2)
    for i, p in enumerate(PROMPTS[:2]):
        engine.submit(i, Request(tiny_tokenizer().encode(p), GenerationConfig(20, ignore_eos=True)))
    per_step = []
    with torch.inference_mode():
        engine.step()  # prefill
        assert calls == []
        for _ in range(12):
            calls.clear()
            engine.step()
            per_step.append(len(calls))
    assert per_step[:10] == [0] * 10
    assert per_step[10] == per_step[11] + 1 and per_step[11] >= 2  # catch-up + (draft level + commit)


def test_a_probe_prices_the_paused_pairs_not_yet_written_without_writing_them():
    """``catch_up_pairs`` (what a probe or a resume would encode) counts the prompt's pairs and every paused step's,
    those kept in the unwritten run included, plus one forward's fixed cost; asking writes nothing."""
    import torch

    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.proposer import CATCH_UP_FORWARD_PAIRS, EagleProposer
    from eaglespec.spec.strategies import NoDraft
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    proposer = EagleProposer(make_head(target, "eagle3"), Scripted([NoDraft()]))
    engine = Engine(target, proposer, max_batch_size=1)
    prompt = tiny_tokenizer().encode(PROMPTS[0])
    engine.submit(0, Request(prompt, GenerationConfig(20, ignore_eos=True)))
    with torch.inference_mode():
        for _ in range(6):  # the prefill and 5 paused steps
            engine.step()
    row = proposer._host.rows[0]
    assert len(proposer._lag_run) == 5
    assert proposer.catch_up_pairs([row]) == len(prompt) + 5 + CATCH_UP_FORWARD_PAIRS
    assert len(proposer._lag_run) == 5  # still unwritten


def _probed_steps(dispatcher, steps: int) -> list[int]:
    """The steps (0-based) at which a batch of row 0 drafts while every draft is rejected."""
    drafted = []
    for step in range(steps):
        cfg = dispatcher.pick(1, [0])
        if cfg.drafts:
            drafted.append(step)
            dispatcher.observe([0], cfg, [0])  # nothing accepted
    return drafted


@pytest.mark.parametrize("probe_steps", [1, 4])
def test_paused_dispatcher_probes_ever_less_often_while_drafting_does_not_pay(probe_steps):
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costly = flat_costs(per_token=0.01)  # chain 1 pays above 58% depth-1 acceptance
    # believed accepted 45% of the time whatever the probes see: not paying, but it would at 1.5 x 45%
    d = AdaptiveDispatcher(costly, repick_every=1, probe_every=2, max_probe_every=8, probe_steps=probe_steps,
                           prior=AcceptanceTracker(prior=(0.45,) * 8, weight=1e6))
    d.start_row(0)
    drafted = _probed_steps(d, 80)
    runs = [[drafted[0]]]
    for a, b in zip(drafted, drafted[1:]):
        runs[-1].append(b) if b == a + 1 else runs.append([b])
    assert all(len(r) == probe_steps for r in runs)  # every probe drafts probe_steps steps in a row
    waits = [b[0] - a[-1] for a, b in zip(runs, runs[1:])]  # a run starts `wait` steps after the last one ended
    assert runs[0][0] == 1 and waits[0] == 4 and set(waits[1:]) == {8}  # waits of 2, 4, then 8 (the cap)
    with pytest.raises(ValueError, match="max_probe_every"):
        AdaptiveDispatcher(costly, probe_every=8, max_probe_every=4)
    with pytest.raises(ValueError, match="probe_steps"):
        AdaptiveDispatcher(costly, probe_steps=0)


def test_paused_dispatcher_chooses_again_only_on_new_evidence(monkeypatch):
    """While paused nothing is observed, so the periodic re-pick would compute the same answer: it is skipped
    until a probe's observations, a new row or a new batch size arrive."""
    from eaglespec.spec import dispatch

    calls = []
    real = dispatch.choose
    monkeypatch.setattr(dispatch, "choose", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    costly = flat_costs(per_token=0.01)  # nothing pays without acceptance: the dispatcher pauses
    d = dispatch.AdaptiveDispatcher(costly, repick_every=1, probe_every=8, max_probe_every=8, probe_steps=1,
                                    batched_probe_optimism=1.5)  # the batch-2 probe below is made
    d.start_row(0)
    assert not d.pick(1, [0]).drafts and len(calls) == 1
    for _ in range(5):  # paused, no probe yet: no new evidence
        assert not d.pick(1, [0]).drafts
    assert len(calls) == 1
    d.start_row(1)
    assert not d.pick(2, [0, 1]).drafts  # a new row (and batch size): chosen again
    assert calls == [1, 2]
    probe = d.pick(2, [0, 1])  # the 8th paused step probes (its choice at optimistic acceptance: could it pay?)
    assert probe.drafts and calls == [1, 2, 2]
    d.observe([0, 1], probe, [0, 0])
    d.pick(2, [0, 1])  # the probe ended with new evidence: chosen again
    assert calls == [1, 2, 2, 2]


def test_a_new_request_is_probed_after_probe_every_paused_steps_whatever_the_requests_before_it_did():
    """Requests one after another in one cache row (batch 1): the first pauses and its probes find nothing, so
    its waits double; the next request, paused from its start by the pooled acceptance, is probed
    ``probe_every`` steps after it joined (measured before: a 128-token MT-bench request ran paused throughout
    at 0.96x of vanilla where the chain of 1 ran 1.09x, its first probe due after its budget), and not at its
    first step either, where it has recorded nothing to look back on."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costly = flat_costs(per_token=0.01)  # chain 1 pays above 58% depth-1 acceptance; a probe could at 45%
    d = AdaptiveDispatcher(costly, repick_every=1, probe_every=4, max_probe_every=64, probe_steps=1,
                           prior=AcceptanceTracker(prior=(0.45,) * 8, weight=1e6))
    for request in range(3):
        d.start_row(0)
        probes = _probed_steps(d, 100)
        d.end_row(0)
        assert probes[:3] == [3, 11, 27]  # waits 4, 8, 16 from the request's own start, then 32, 64
    # joining a batch keeps its schedule: a probe's catch-up encodes every row's prompt and recorded pairs
    d.start_row(0)
    _probed_steps(d, 40)
    wait, since = d._probe_wait, d._since_draft
    d.start_row(1)
    assert (d._probe_wait, d._since_draft) == (wait, since) and wait > 4


def test_drafting_that_needs_a_catch_up_starts_only_where_the_tokens_left_repay_it():
    """Starting to draft first encodes the waiting pairs through the head (a new request's prompt, the pairs
    recorded while paused). Over R tokens left, a tree predicted at S saves R * (1 - 1/S) plain steps; a catch-up of
    C plain steps (at the timed price of a pair) must be repaid: S >= R / (R - C). Nothing waiting, no budget or no
    timed catch-up: the usual margin."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = flat_costs()  # plain 10.5 ms, a chain of 2 13.5 ms: at 50% acceptance a depth 1.361x (the best)
    good = AcceptanceTracker(prior=(0.5,) * 8, weight=1e6)

    def first_pick(resume_pairs, budget=(100,), timed=True):
        d = AdaptiveDispatcher(costs, repick_every=1, prior=good)
        d.start_row(0)
        if timed:
            d.observe_catch_up(100, 100 * costs.verify_cost(1, 1) / 10)  # 10 pairs cost one plain step
        cfg = d.pick(1, [0], look_back=True, budget=budget, resume=lambda: resume_pairs)
        assert d.last.predicted_speedup == pytest.approx(1.75 * 10.5 / 13.5) or not cfg.drafts
        return cfg.label

    assert first_pick(0) == "chain2"  # nothing waits
    assert first_pick(100) == "chain2"  # 10 steps of 100: needs 1.11x
    assert first_pick(300) == "none"  # 30 steps of 100: needs 1.43x
    assert first_pick(300, budget=(400,)) == "chain2"  # of 400: 1.08x
    assert first_pick(1000) == "none"  # as many steps as tokens left: never
    assert first_pick(1000, budget=None) == "chain2"  # budget unknown: the usual margin
    assert first_pick(1000, timed=False) == "chain2"  # no catch-up timed yet: its price unknown
    # a batch that drafts with nothing waiting keeps its tree by keep_margin; one whose new row waits must repay it
    d = AdaptiveDispatcher(costs, repick_every=1, prior=good)
    d.start_row(0)
    d.observe_catch_up(100, 100 * costs.verify_cost(1, 1) / 10)
    assert d.pick(1, [0], budget=[100], resume=lambda: 0).drafts
    d.observe([0], d.candidates["chain2"], [2])  # new evidence: chosen again
    assert not d.pick(1, [0], budget=[100], resume=lambda: 1000).drafts


def test_a_request_alone_explores_only_where_a_hopeful_resume_could_repay_the_look_back():
    """The one look-back of a request alone (whatever the pool says) catches its draft cache up over its prompt:
    skipped where that costs more plain steps than drafting at 1.5x the default prior could save over the tokens
    left (a long prompt with a short answer); made where it is cheap, and where no catch-up was timed yet."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costly = flat_costs(per_token=0.01)  # chain 1 pays above 58% depth-1 acceptance: 1.5 x 50% = 75% would
    low = AcceptanceTracker(prior=(0.20,) * 8, weight=1e6)  # the pool: 1.5 x 20% could not

    def looks(pairs, budget, timed=True):
        d = AdaptiveDispatcher(costly, repick_every=1, probe_every=4, max_probe_every=64, probe_steps=1, prior=low)
        if timed:
            d.observe_catch_up(100, 100 * costly.verify_cost(1, 1) / 10)  # 10 pairs a plain step
        d.start_row(0)
        seen = []
        for step in range(20):
            assert not d.pick(1, [0], look_back=True, budget=[budget], catch_up=lambda: pairs).drafts
            if d.look_back_due:
                seen.append(step)
                d.observe_look_back([0], [0.0], [4])
        return seen

    assert looks(pairs=50, budget=100) == [3]  # 5 steps against the ~11 a chain of 1 at 75% would save
    assert looks(pairs=500, budget=100) == []  # 50 steps: more than any resume could win back
    assert looks(pairs=500, budget=1000) == [3]  # a long answer repays it
    assert looks(pairs=500, budget=100, timed=False) == [3]  # no price yet: explored as before


def test_each_request_alone_gets_one_look_back_even_where_the_pool_says_no_recovery_could_pay():
    """A pool whose acceptance is too low for a probe to be worth it (``_probe_could_pay``: not even at 1.5x)
    skips every probe, so it would never observe anything again: a request alone in the batch still looks back
    once, ``probe_every`` steps after it started, where it has tokens left for a resume to matter; later probes of
    it, requests joining others, and drafting probes (no pairs to look back on) keep the rule."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costly = flat_costs(per_token=0.01)  # chain 1 pays above 58% depth-1 acceptance; 1.5 x 20% = 30% could not
    low = AcceptanceTracker(prior=(0.20,) * 8, weight=1e6)

    def looks(d, steps, budget=100, rows=(0,)):
        seen = []
        for step in range(steps):
            assert not d.pick(len(rows), list(rows), look_back=True, budget=[budget] * len(rows)).drafts
            if d.look_back_due:
                seen.append(step)
                d.observe_look_back(list(rows), [0.0] * len(rows), [4] * len(rows))  # nothing would have been hit
        return seen

    d = AdaptiveDispatcher(costly, repick_every=1, probe_every=4, max_probe_every=64, probe_steps=1, prior=low)
    for request in range(3):
        d.start_row(0)
        assert looks(d, 120) == [3]  # once, and never again in this request (the pool still says no)
        d.end_row(0)
    d.start_row(0)
    assert looks(d, 120, budget=3) == []  # fewer tokens left than the wait: nothing to win
    d.end_row(0)
    d.start_row(0)
    d.start_row(1)  # two rows: no exploring (a catch-up would encode both rows' prompts)
    assert looks(d, 120, rows=(0, 1)) == []
    d = AdaptiveDispatcher(costly, repick_every=1, probe_every=4, max_probe_every=64, probe_steps=1, prior=low)
    d.start_row(0)
    assert _probed_steps(d, 120) == []  # without look-back a probe drafts: the rule alone decides


def test_the_spread_of_requests_acceptance_by_hand():
    """``RequestSpread``: the requests' mean rate, their variance less each one's sampling noise (at least the sd
    floor squared) as a Beta's strength, a request's posterior from it and its own counts; requests with too little
    evidence not counted, only the latest ``keep`` kept, nothing said below ``min_requests``, bad counts refused."""
    from eaglespec.spec.costmodel import RequestSpread

    s = RequestSpread(keep=3, min_requests=2, min_tries=8, sd_floor=0.01)
    assert s.prior() is None and s.posterior(3, 10) is None
    assert not s.add(1, 4)  # below min_tries: not counted
    assert s.add(40, 100) and s.prior() is None  # one request: no spread yet
    assert s.add(60, 100)
    m, k = s.prior()
    v = 0.02 - 0.0024  # rates 0.4 and 0.6: variance 0.02 (n - 1), less the mean of 0.24 / 100
    assert m == pytest.approx(0.5) and k == pytest.approx(0.25 / v - 1)
    mean, sd = s.posterior(3, 10)
    assert mean == pytest.approx((k * 0.5 + 3) / (k + 10)) and sd == pytest.approx(math.sqrt(mean * (1 - mean) / (k + 11)))
    s.add(50, 100)
    s.add(50, 100)  # keep=3: the 0.4 leaves; 0.6, 0.5, 0.5 stay
    m, k = s.prior()
    assert m == pytest.approx(1.6 / 3) and len(s.seen) == 3
    alike = RequestSpread(min_requests=2, sd_floor=0.05)
    alike.add(50, 100)
    alike.add(50, 100)  # no spread at all: the floor's sd 0.05 stands
    assert alike.prior() == pytest.approx((0.5, 0.25 / 0.05 ** 2 - 1))
    wild = RequestSpread(min_requests=2)
    wild.add(0, 100)
    wild.add(100, 100)  # as far apart as rates go: the strength bottoms at one pseudo-try
    assert wild.prior() == pytest.approx((0.5, 1.0))
    with pytest.raises(ValueError, match="hits <= tries"):
        s.add(5, 4)
    with pytest.raises(ValueError, match="min_requests"):
        RequestSpread(keep=3, min_requests=4)


def test_a_request_alone_looks_back_only_where_the_requests_before_it_say_it_could_win():
    """Once enough requests were counted (``RequestSpread``), a request alone in its batch looks back only where
    the mean saving over its possible rates (the spread's posterior) repays the look-back: after requests that all
    accepted ~20% (break-even ~38%) it stays paused, except the first and every ``EXPLORE_EVERY``-th request,
    which explore anyway; after requests split between 10% and 70% it looks back. Before enough requests, with
    several rows, and with ``spread_probes=False``, the optimist's rule decides as before."""
    from eaglespec.spec import dispatch
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = flat_costs(per_token=0.004)  # chain 1 pays above ~38% depth-1 acceptance at batch 1

    def requests(rates, **kw):  # every request starts paused, from the pool (the spread's start: tested below)
        d = AdaptiveDispatcher(costs, [Chain(1), Chain(2)], repick_every=1, probe_every=4, max_probe_every=64,
                               probe_steps=1, prior=AcceptanceTracker(prior=(0.2, 0.2), weight=1e6),
                               spread_prior=False, **kw)
        explored = []
        for rate in rates:
            d.start_row(0)
            looked = False
            for _ in range(12):  # until its first look-back (after which it may draft)
                assert not d.pick(1, [0], look_back=True, budget=[100]).drafts
                if d.look_back_due:
                    looked = True
                    d.observe_look_back([0], [32 * rate], [32])
                    break
            explored.append(looked)
            d.end_row(0)
        return explored, d

    assert dispatch.EXPLORE_EVERY == 4
    low, d = requests([0.2] * 10)
    # requests 0-3: too few counted (the rule before); 4 and 8: the forced explorers; the rest stay paused
    assert low == [True] * 5 + [False] * 3 + [True, False], low
    assert len(d.spreads[False].seen) == 6  # the six that looked back were counted, the others had no evidence
    split, _ = requests([0.1, 0.7] * 5)
    assert split == [True] * 10, split
    off, _ = requests([0.2] * 10, spread_probes=False)  # the rule before: every request alone explores
    assert off == [True] * 10, off
    # never counted: requests that see too little evidence (4 pairs each) leave the rule before as it was
    few = AdaptiveDispatcher(costs, [Chain(1), Chain(2)], repick_every=1, probe_every=4, max_probe_every=64,
                             probe_steps=1, prior=AcceptanceTracker(prior=(0.2, 0.2), weight=1e6))
    for _ in range(6):
        few.start_row(0)
        few.observe_look_back([0], [0.8], [4])
        few.end_row(0)
    assert not few.spreads[False].seen


def test_a_batch_of_several_probes_only_where_a_smaller_recovery_would_pay():
    """With several rows a probe needs drafting to pay at ``batched_probe_optimism`` (1.2) times the rows' mean
    acceptance, not 1.5 times: a batch's mean moves less than one request's."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costly = flat_costs(per_token=0.01)  # batch 4: a chain of 1 needs ~85% depth-1 acceptance past the 1.10 margin

    def look_backs(**kw):
        d = AdaptiveDispatcher(costly, repick_every=1, probe_every=2, max_probe_every=8, probe_steps=1,
                               prior=AcceptanceTracker(prior=(0.6,) * 8, weight=1e6), **kw)
        for r in range(4):
            d.start_row(r)
        seen = 0
        for _ in range(40):
            assert not d.pick(4, [0, 1, 2, 3], look_back=True).drafts
            if d.look_back_due:
                seen += 1
                d.observe_look_back([0, 1, 2, 3], [0.0] * 4, [0] * 4)
        return seen

    assert look_backs() == 0  # 1.2 x 60% = 72%: could not pay
    assert look_backs(batched_probe_optimism=1.5) > 0  # 1.5 x 60% = 90% could: probed as before
    with pytest.raises(ValueError, match="batched_probe_optimism"):
        AdaptiveDispatcher(costly, batched_probe_optimism=0.9)


def _simulate(dispatcher, accept, steps, seed):
    """Chains drafted by ``dispatcher`` against a head accepted with probability ``accept`` at every depth."""
    rng = random.Random(seed)
    dispatcher.start_row(0)
    drafted = 0
    for _ in range(steps):
        cfg = dispatcher.pick(1, [0])
        if cfg.drafts:
            drafted += 1
            k = 0
            while k < cfg.depth and rng.random() < accept:
                k += 1
            dispatcher.observe([0], cfg, [k])
    return drafted / steps


def test_dispatcher_keeps_drafting_a_head_that_pays_near_break_even():
    """Chain 1 breaks even at ~22% acceptance on these costs; a head accepted 45% of the time must keep drafting
    (with the earlier short memory and weak prior, a few early misses stopped drafting for good in 4 of these
    10 seeds: 17-63% of the steps drafted)."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = flat_costs(per_token=0.001)
    shares = [_simulate(AdaptiveDispatcher(costs, [Chain(1), Chain(2)]), 0.45, 150, seed) for seed in range(10)]
    assert min(shares) > 0.8 and sum(shares) / len(shares) > 0.9, shares
    # and one that is never accepted is left alone after a few probes
    never = [_simulate(AdaptiveDispatcher(costs, [Chain(1), Chain(2)]), 0.0, 150, seed) for seed in range(3)]
    assert max(never) < 0.25, never


def test_calibration_counts_what_a_tree_step_costs_beyond_its_drafting(monkeypatch):
    """A tree's step is priced at the median ratio of its engine steps to a plain engine's, stepped in turns,
    times the priced plain step (the tree's own verification and commit work, and a forward dearer in the
    engine than alone, count; a forward priced too high alone does not make the step dearer; a machine
    slower than when the forwards were timed does not either); stalls that hit a few steps leave it alone; a plain step's overhead is its median engine step less the forward, and at
    most the steps less their own forwards, whose stalls leave it alone."""
    from types import SimpleNamespace

    from eaglespec.engine import calibrate as cal

    machine = {"tree_nf": 0.005, "tree_fw": 0.0115, "plain_fw": 0.010, "stalled": (), "tree_only": False,
               "pace": 1.0}

    def steps(target, proposer, batch, n, prompt, temperature=0.0, forwards=None):  # 9 steps and one stall
        stats = SimpleNamespace(target_forwards=n - 1, draft_s=0.001 * (n - 1))  # drafting 1 ms a step
        fw = [machine["plain_fw"]] * 9 + [0.49]
        if forwards is not None:
            forwards.extend(fw)
        return [f + 0.002 for f in fw], stats

    def paired(target, proposer, batch, n, prompt, temperature=0.0):  # the tree's steps and the plain ones
        stats = SimpleNamespace(target_forwards=n - 1, draft_s=0.001 * (n - 1))
        slow = [1.5 if i in machine["stalled"] else 1.0 for i in range(11)]
        tree = [(machine["tree_fw"] * k + machine["tree_nf"]) * machine["pace"] for k in slow]
        plain = [(0.010 * (1.0 if machine["tree_only"] else k) + 0.002) * machine["pace"] for k in slow]
        return tree, plain, stats

    monkeypatch.setattr(cal, "_step_times", steps)
    monkeypatch.setattr(cal, "_paired_steps", paired)
    target = SimpleNamespace(model=SimpleNamespace(device=None))
    verify = {(b, n): 0.010 + 0.001 * (n - 1) for b in (1, 2) for n in (1, 2, 4)}
    overhead = cal.measure_overhead(target, verify, batches=(1, 2))
    assert overhead == pytest.approx({1: 0.002, 2: 0.002})  # 12 ms a step, the forward 10
    machine["plain_fw"] = 0.013  # the steps' forwards stall: the steps less verify(b, 1) would read 5 ms
    assert cal.measure_overhead(target, verify, batches=(1, 2)) == pytest.approx(overhead)
    costs = CostTable(verify, {}, overhead=overhead)
    trees = {"chain1": Chain(1)}
    assert cal.measure_draft(target, lambda t: object(), trees, (1, 2))[(1, "chain1")] == pytest.approx(0.001)
    with_steps = cal.measure_draft(target, lambda t: object(), trees, (1, 2), costs)
    # a tree step 16.5 ms, a plain one 12: 4.5 ms more, of which the forwards' priced difference is 1
    assert with_steps[(1, "chain1")] == pytest.approx(0.0035)
    machine["stalled"] = (2, 3, 4)  # a stall over three pairs of steps
    assert cal.measure_draft(target, lambda t: object(), trees, (1, 2), costs) == pytest.approx(with_steps)
    machine["tree_only"] = True  # ... or over three of the tree's steps alone
    assert cal.measure_draft(target, lambda t: object(), trees, (1, 2), costs) == pytest.approx(with_steps)
    machine.update(stalled=(), tree_only=False, pace=1.3)  # the whole machine 30% slower than when the forwards
    assert cal.measure_draft(target, lambda t: object(), trees, (1, 2), costs) == pytest.approx(with_steps)
    machine["pace"] = 1.0  # were timed: the steps' difference reads 30% more (5.85 ms), their ratio does not
    machine.update(stalled=(), tree_fw=0.030)  # its forward 20 ms dearer in the engine where 1 is priced
    assert cal.measure_draft(target, lambda t: object(), trees, (1, 2), costs)[(1, "chain1")] == \
        pytest.approx(0.030 + 0.005 - 0.012 - 0.001)
    machine.update(tree_fw=0.0115)
    # forwards of 2 tokens and more read 4 ms high alone (a stall): priced 5 ms above a 1-token one, not 1
    stalled = CostTable({k: s + (0.004 if k[1] > 1 else 0.0) for k, s in verify.items()}, {}, overhead=overhead)
    got = cal.measure_draft(target, lambda t: object(), trees, (1, 2), stalled)
    assert got[(1, "chain1")] == pytest.approx(0.0045 - 0.005)  # below the head's own 1 ms (until version 18 ...
    assert got[(1, "chain1")] + stalled.verify_cost(1, 2) == pytest.approx(0.0165)  # ... 4 ms high): the engine's step


def test_a_paused_step_is_not_free_and_a_break_even_chain_beats_it():
    costs = flat_costs()
    v1 = costs.verify_cost(1, 1)
    tracker = AcceptanceTracker(prior=(0.13,), weight=1e6)  # chain 1: 1.13 tokens a step
    chain1 = predicted_speedup(costs, 1, "chain1", 2, 1.13)
    assert 0.98 < chain1 < 1.0  # just under break-even against a free plain step ...
    assert choose(costs, 1, {"chain1": (2, 1)}, tracker).label == "none"
    paused = CostTable(costs.verify, costs.draft, paused={1: 0.05 * v1, 4: 0.0})
    assert predicted_speedup(paused, 1, "none", 1, 1.0) == pytest.approx(1 / 1.05)
    assert choose(paused, 1, {"chain1": (2, 1)}, tracker).label == "chain1"  # ... but a paused step costs 5%
    assert choose(paused, 4, {"chain1": (2, 1)}, tracker).label == "none"


def test_calibration_measures_the_paused_step_with_its_catch_ups(monkeypatch):
    from types import SimpleNamespace

    from eaglespec.engine import calibrate as cal

    # paused: 11 ms a step and a 40 ms catch-up every 8th; plain: 10 ms; both engines stepped in turns, and a
    # stretch of the machine slowed by half that hits some step pairs (both steps of a pair alike)
    slow = [1.5 if 9 <= i < 14 else 1.0 for i in range(16)]

    def paired(target, proposer, batch, n, prompt, temperature=0.0):
        assert proposer is not None
        paused = [(0.051 if i % 8 == 7 else 0.011) * k for i, k in enumerate(slow)]
        return paused, [0.010 * k for k in slow], None

    monkeypatch.setattr(cal, "_paired_steps", paired)
    got = cal.measure_paused(SimpleNamespace(), lambda tree: SimpleNamespace(max_lag=8), batches=(1, 2, 4))
    assert got[1] == pytest.approx(0.001 + 2 * 0.040 / 16)  # the slow stretch is in both steps of a pair: no cost
    assert set(got) == {1, 2, 4}
    asked = []
    monkeypatch.setattr(cal, "_paired_steps",
                        lambda t, p, b, n, prompt, temperature=0.0: asked.append(n) or paired(t, p, b, n, prompt))
    cal.measure_paused(SimpleNamespace(), lambda tree: SimpleNamespace(max_lag=8), batches=(1,), reps=1)
    cal.measure_paused(SimpleNamespace(), lambda tree: SimpleNamespace(max_lag=256), batches=(1,), reps=1)
    assert asked == [36, cal.PAUSED_STEPS + 4]  # 2 x max(buffer, 16), a request at most
    table = cal._from_json(cal._to_json(CostTable({(1, 1): 0.01}, {}, paused=got)))
    assert table.paused == pytest.approx(got)


def test_a_longer_chain_is_never_calibrated_cheaper_than_a_shorter_one(monkeypatch):
    """Noise once read a chain of 2 cheaper than a chain of 1 (2.55 vs 2.86 ms) and the dispatcher preferred it."""
    from types import SimpleNamespace

    from eaglespec.engine import calibrate as cal

    per_step = {1: 0.003, 2: 0.0025, 3: 0.004}  # seconds of drafting a step: the chain of 2 read low

    def steps(target, proposer, batch, n, prompt, temperature=0.0, forwards=None):
        stats = SimpleNamespace(target_forwards=n - 1, draft_s=per_step[proposer.depth] * (n - 1))
        return [0.01] * n, stats

    monkeypatch.setattr(cal, "_step_times", steps)
    target = SimpleNamespace(model=SimpleNamespace(device=None))
    trees = {f"chain{k}": Chain(k) for k in (3, 1, 2)}
    got = cal.measure_draft(target, lambda tree: tree, trees, (1,))
    assert got[(1, "chain1")] == pytest.approx(0.003)
    assert got[(1, "chain2")] == pytest.approx(0.003)  # raised to the chain of 1's
    assert got[(1, "chain3")] == pytest.approx(0.004)


def test_a_batch_holding_a_sampled_request_is_priced_by_the_sampled_calibration():
    """Sampled requests cost more per step (sampling, the sampled verification rule, drawn children): the
    dispatcher prices a batch holding one by the sampled overhead and drafting. Here the chain of 1 pays for
    greedy rows and not for sampled ones at the same acceptance, so the choice follows the rows' kind."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = flat_costs()
    costs.sampled_overhead = {1: 0.0, 4: 0.0}
    costs.sampled_draft = {(b, f"chain{d}"): 0.008 * d for b in (1, 4) for d in range(1, 7)}
    d = AdaptiveDispatcher(CostTable(costs.verify, costs.draft, sampled_overhead=costs.sampled_overhead,
                                     sampled_draft=costs.sampled_draft), [Chain(1)])
    d.pools[True] = AcceptanceTracker(prior=(0.6,) * 6)  # sampled rows start as accepted as greedy ones
    d.start_row(0)
    assert d.pick(1, [0]).label == "chain1"
    d.end_row(0)
    d.start_row(0, sampled=True)
    picks = [d.pick(1, [0]).label for _ in range(d.repick_every)]  # chosen again within repick_every steps
    assert picks[-1] == "none" and d.last.label == "none"


def test_greedy_and_sampled_requests_pool_their_acceptance_apart():
    """A sampled request accepts less than a greedy one; a mixed stream must not start sampled requests from
    greedy acceptance (nor the reverse)."""
    import torch

    from eaglespec.config import GenerationConfig, SamplingParams
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec.dispatch import AdaptiveDispatcher
    from eaglespec.spec.proposer import EagleProposer
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    d = AdaptiveDispatcher(flat_costs(), [Chain(1), Chain(2)])
    prior = d.pools[True].rates()
    d.start_row(0)
    for _ in range(30):
        d.observe([0], Chain(2), [2])  # greedy: everything accepted
    d.end_row(0)
    d.start_row(1, sampled=True)
    assert d.rows[1].rates() == pytest.approx(prior)  # not the greedy row's ~1.0
    d.start_row(2)
    assert d.rows[2].rates()[0] > 0.9

    # through the engine: a sampled request feeds the sampled pool only, a greedy one the greedy pool only
    target, _ = tiny_target("llama")
    prompt = tiny_tokenizer().encode(PROMPTS[0])
    for sampling, fed in ((SamplingParams(temperature=1.0, seed=3), True), (SamplingParams(temperature=0.0), False)):
        d = AdaptiveDispatcher(flat_costs(per_token=0.0, draft_per_level=0.0), [Chain(2)], repick_every=1)
        before = {k: list(p.tries) for k, p in d.pools.items()}
        with torch.inference_mode():
            Engine(target, EagleProposer(make_head(target, "eagle3"), d), max_batch_size=1).generate(
                [Request(prompt, GenerationConfig(16, sampling, ignore_eos=True))])
        assert d.pools[fed].tries != before[fed] and d.pools[not fed].tries == before[not fed]


def test_a_burst_of_load_during_one_reading_does_not_set_a_trees_cost(monkeypatch):
    """A shared machine slows for a second or two: the reading taken then is one of three, taken in rounds over
    the trees (never back to back), and the median keeps the quiet value."""
    from types import SimpleNamespace

    from eaglespec.engine import calibrate as cal

    order = []

    def steps(target, proposer, batch, n, prompt, temperature=0.0, forwards=None):
        if n == cal.LONG_STEPS:
            order.append(proposer.label)
        burst = 5.0 if order.count("chain1") == 1 and proposer.label == "chain1" else 1.0  # chain1's 1st reading
        stats = SimpleNamespace(target_forwards=n - 1, draft_s=0.002 * proposer.depth * burst * (n - 1))
        return [0.01] * n, stats

    monkeypatch.setattr(cal, "_step_times", steps)
    target = SimpleNamespace(model=SimpleNamespace(device=None))
    trees = {f"chain{k}": Chain(k) for k in (1, 2)}
    got = cal.measure_draft(target, lambda tree: tree, trees, (1,))
    assert got[(1, "chain1")] == pytest.approx(0.002) and got[(1, "chain2")] == pytest.approx(0.004)
    assert order == ["chain1", "chain2"] * 3  # rounds over the trees


def test_a_verified_token_costs_more_in_a_longer_context_and_can_flip_the_choice():
    """Every verified token attends to the whole context: a chain that pays at a short context can lose at a
    long one, where its extra token costs more (slopes as measured on a 2-core Xeon, in seconds per context token)."""
    verify = {(1, 1): 0.0090, (1, 2): 0.0095, (1, 4): 0.0110}
    slope = {(1, 1): 5.6e-6, (1, 2): 8.0e-6, (1, 4): 12.0e-6}
    costs = CostTable(verify, {(1, "chain1"): 0.0015}, context=slope, prefix=128)
    assert costs.verify_cost(1, 2) == pytest.approx(0.0095)  # no context given: the calibrated prefix's cost
    assert costs.verify_cost(1, 2, 128) == pytest.approx(0.0095)
    assert costs.verify_cost(1, 2, 1128) == pytest.approx(0.0095 + 1000 * 8.0e-6)
    assert costs.verify_cost(1, 3, 628) == pytest.approx(0.01025 + 500 * 10.0e-6)  # interpolated along n
    tracker = AcceptanceTracker(prior=(0.25,), weight=1e6)  # chain 1: 1.25 tokens a step
    cands = {"chain1": (2, 1)}
    short, long = choose(costs, 1, cands, tracker, 1.02, 128), choose(costs, 1, cands, tracker, 1.02, 2048)
    assert short.label == "chain1" and short.predicted_speedup == pytest.approx(1.25 * 0.009 / 0.011)
    assert long.label == "none"
    assert predicted_speedup(costs, 1, "chain1", 2, 1.25, 2048) < 1.0


def test_context_slopes_are_capped_by_larger_forwards_and_never_negative():
    verify = {(b, n): 0.01 * b * n for b in (1, 2) for n in (1, 2)}
    slope = {(1, 1): 9e-6, (1, 2): 2e-6, (2, 1): -1e-6, (2, 2): 3e-6}  # noise: (1, 1) above (1, 2), (2, 1) < 0
    costs = CostTable(verify, {}, context=slope, prefix=100)
    assert costs.context_envelope == pytest.approx({(1, 1): 0.0, (1, 2): 2e-6, (2, 1): 0.0, (2, 2): 3e-6})
    assert costs.verify_cost(2, 1, 50) == pytest.approx(0.02)  # a shorter context than calibrated: never negative slope


def test_calibration_measures_the_cost_per_context_token(monkeypatch):
    from types import SimpleNamespace

    from eaglespec.engine import calibrate as cal

    asked = []

    def forwards_at(model, batches, tokens, prefixes):  # 10 ms + 4 us per context token per verified token
        asked.append(tuple(prefixes))
        return {p: {(b, n): 0.010 + 4e-6 * n * p for b in batches for n in tokens} for p in prefixes}

    monkeypatch.setattr(cal, "measure_forwards", forwards_at)
    model = SimpleNamespace(args=SimpleNamespace(max_position_embeddings=2048))
    base, got = cal.measure_verify_and_context(model, (1, 4), (1, 2), 128, (320, 512))
    assert asked == [(128, 320, 512)]  # every prefix in the same rounds
    assert base == pytest.approx({(b, n): 0.010 + 4e-6 * n * 128 for b in (1, 4) for n in (1, 2)})
    assert got == pytest.approx({(b, n): 4e-6 * n for b in (1, 4) for n in (1, 2)})
    small = SimpleNamespace(args=SimpleNamespace(max_position_embeddings=400))  # holds 320 + 2 + 1, not 512
    assert set(cal.measure_verify_and_context(small, (1, 4), (1, 2), 128, (320, 512))[1]) == set(base)
    assert asked[-1] == (128, 320)
    assert cal.measure_verify_and_context(SimpleNamespace(args=SimpleNamespace(max_position_embeddings=200)),
                                          (1, 4), (1, 2), 128, (320, 512))[1] == {}
    assert asked[-1] == (128,)
    # the least-squares line through noisy points
    assert cal.context_slopes({100: {(1, 1): 1.0}, 200: {(1, 1): 2.2}, 300: {(1, 1): 2.8}}) == \
        pytest.approx({(1, 1): 0.009})
    table = CostTable(base, {}, context=got, prefix=128)
    again = cal._from_json(cal._to_json(table))
    assert again.context == pytest.approx(got) and again.prefix == 128
    assert again.verify_cost(4, 2, 1000) == pytest.approx(table.verify_cost(4, 2, 1000))


def test_a_paused_run_too_short_to_catch_up_counts_no_stall():
    """The paused step's price counts the run's catch-ups, one per max_lag recorded pairs, and nothing else: a
    stall of the machine in a run that never caught up is not a catch-up."""
    from types import SimpleNamespace

    from eaglespec.engine import calibrate as cal

    steps = [0.010] * 128
    steps[40] = 0.030  # a stall
    assert cal._catch_up_excess(steps, SimpleNamespace(max_lag=256)) == 0.0
    caught = [0.050 if i % 32 == 31 else 0.010 for i in range(128)]  # 4 catch-ups of 40 ms excess
    caught[5] = 0.030  # and a stall, smaller than any catch-up
    assert cal._catch_up_excess(caught, SimpleNamespace(max_lag=32)) == pytest.approx(4 * 0.040 / 128)


def test_a_paused_batch_chooses_again_once_its_context_has_grown():
    from eaglespec.spec import dispatch

    costs = CostTable({(1, 1): 0.009, (1, 2): 0.0095}, {(1, "chain1"): 0.0015},
                      context={(1, 1): 5.6e-6, (1, 2): 8e-6}, prefix=128)
    d = dispatch.AdaptiveDispatcher(costs, [Chain(1)], prior=AcceptanceTracker(prior=(0.25,), weight=1e6),
                                    repick_every=1, probe_every=1000, max_probe_every=1000)
    d.start_row(0)
    assert d.pick(1, [0], context=128).drafts
    d.observe([0], Chain(1), [1])
    d.observe([0], Chain(1), [0])
    assert d.pick(1, [0], context=130).drafts
    assert not d.pick(1, [0], context=130 + dispatch.CONTEXT_BUCKET * 30).drafts  # ~2K tokens: paused
    assert d.last.label == "none"


def test_a_look_back_probe_scores_the_guesses_a_chain_would_have_drafted(monkeypatch):
    """While paused, a probe that looks back scores the head's top-1 guess from each recorded pair against the
    token the target committed next: the same guesses (and hence the same counts) as a chain of 1 would have
    drafted at those steps, here read off a drafter that encodes every pair at its step (max_lag=0). Only the
    latest LOOK_BACK pairs count; the probe's step stays plain, a head found always right drafts at the next
    step, and the greedy tokens stay vanilla's."""
    import torch

    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec import proposer as prop
    from eaglespec.spec.dispatch import AdaptiveDispatcher
    from eaglespec.spec.strategies import NoDraft
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    head = make_head(target, "eagle3")
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(20, ignore_eos=True)) for p in PROMPTS[:2]]

    def guess(h):  # [B, H] -> the top-1 root child a chain drafts from h [B]
        return head.to_target_ids(head.logits(h[:, None]).argmax(dim=-1))[:, 0]

    oracle = prop.EagleProposer(head, NoDraft(), max_lag=0)  # every pair encoded at its step: last_h is current
    guesses = {0: [], 1: []}  # row -> the guess after each decode step
    commit = oracle.commit

    def record(rows, *a, **k):
        commit(rows, *a, **k)
        for r, g in zip(rows.tolist(), guess(oracle.last_h[rows]).tolist()):
            guesses[r].append(g)

    oracle.commit = record
    with torch.inference_mode():
        out = [c.token_ids for c in Engine(target, oracle, max_batch_size=2).generate(reqs)]
    assert out == _greedy_runs(target, None, [r.prompt_ids for r in reqs], n=20)

    monkeypatch.setattr(prop, "LOOK_BACK", 3)
    # chain 1 pays above ~21% depth-1 acceptance; the head is believed at 16%: paused, and probing after 6 steps
    # (at 1.5 x 16% it would pay; in these 20-token requests too few tokens are left for that to repay a probe,
    # which this test is not about: tested above)
    from eaglespec.spec import dispatch
    monkeypatch.setattr(dispatch, "PROBE_COST_STEPS", 0.0)
    d = AdaptiveDispatcher(flat_costs(per_token=0.001, batches=(1, 2)), prior=AcceptanceTracker(prior=(0.16,) * 8),
                           repick_every=1, probe_every=6, max_probe_every=6, batched_margin=1.02,
                           batched_probe_optimism=1.5)
    seen, scored = [], []
    observe = d.observe_look_back
    d.observe_look_back = lambda rows, hits, tries: seen.append((list(rows), list(hits), list(tries))) or \
        observe(rows, hits, tries)
    lazy = prop.EagleProposer(head, d)
    # decode step s commits out[s + 1]; the probe at step 5 scores the 5 pairs recorded so far (pair j's guess
    # against the token of pair j + 1), the latest 3 of them: j = 1, 2, 3
    window = range(1, 4)
    drawn = []

    def perfect(logits, temperature, x, p_x):  # the look-back's chances [B, K], answered like an always-right head
        assert (temperature == 0).all() and (p_x == 1).all()  # greedy drafts, greedy target
        scored.append(head.to_target_ids(logits.argmax(dim=-1)))  # the random head's own guesses
        drawn.append(x)
        return torch.ones_like(p_x)

    monkeypatch.setattr(prop, "one_token_acceptance", perfect)
    labels = []
    propose = lazy.propose
    lazy.propose = lambda *a, **k: (propose(*a, **k), labels.append(lazy.step_label))[0]
    with torch.inference_mode():
        assert [c.token_ids for c in Engine(target, lazy, max_batch_size=2).generate(reqs)] == out
    rows, hits, tries = seen[0]
    assert rows == [0, 1] and tries == [3, 3] and hits == [3, 3]
    assert scored[0].tolist() == [[guesses[r][j] for j in window] for r in (0, 1)]
    # scored against the tokens the target committed next, in draft ids
    assert drawn[0].tolist() == lazy._target_to_draft()[torch.tensor([[out[r][j + 2] for j in window]
                                                                      for r in (0, 1)])].tolist()
    assert labels[:6] == ["none"] * 6 and labels[6] == "chain1"  # paused until the probe, drafting right after


def test_a_sampled_look_back_probe_scores_the_chances_a_sampled_chain_would_have_had(monkeypatch):
    """At T=1 a paused batch's probe looks back too, instead of drafting: at each of the latest recorded pairs
    the chance that a child drawn from the head's q would have been accepted, min(1, q(x) / p(x)) of the token x
    the target drew at the next step with probability p(x), read here off a drafter that encodes every pair at
    its step (max_lag=0) and the target's distribution at each step. The probe's step stays plain, so a run that
    the estimate keeps paused samples exactly what vanilla decoding samples."""
    import torch

    from eaglespec.config import GenerationConfig, SamplingParams
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.spec import dispatch
    from eaglespec.spec import proposer as prop
    from eaglespec.spec.dispatch import AdaptiveDispatcher
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    head = make_head(target, "eagle3")
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(16, SamplingParams(temperature=1.0, seed=5 + i),
                                                                 ignore_eos=True)) for i, p in enumerate(PROMPTS[:2])]

    def run(proposer):
        with torch.inference_mode():
            return [c.token_ids for c in Engine(target, proposer, max_batch_size=2).generate(reqs)]

    # the oracle never drafts, and proposes from the same candidates (the engine draws as many uniforms a step,
    # so that both runs sample the same tokens while they do not draft)
    never = AdaptiveDispatcher(flat_costs(per_token=0.001, batches=(1, 2)), prior=AcceptanceTracker(prior=(0.0,) * 8),
                               repick_every=1, probe_every=10_000, max_probe_every=10_000)
    never.pools[True] = AcceptanceTracker(prior=(0.0,) * 8)
    oracle = prop.EagleProposer(head, never, max_lag=0)  # every pair encoded at its step: last_h is current
    q_after, p_bonus = {0: [], 1: []}, {0: [], 1: []}  # row -> per decode step: q from its pair, p(its bonus)
    commit = oracle.commit

    def record(rows, tree, verdict, out, **k):
        commit(rows, tree, verdict, out, **k)
        q = torch.softmax(head.logits(oracle.last_h[rows][:, None])[:, 0].float(), -1)  # [B, V'] at T = 1
        for b, r in enumerate(rows.tolist()):
            q_after[r].append(q[b])
            p_bonus[r].append(float(verdict.bonus_p[b]))

    oracle.commit = record
    out = run(oracle)
    assert never.last.label == "none" and len(q_after[0]) == 15  # 15 plain decode steps after the prefill's token

    monkeypatch.setattr(prop, "LOOK_BACK", 3)
    monkeypatch.setattr(dispatch, "PROBE_COST_STEPS", 0.0)
    d = AdaptiveDispatcher(flat_costs(per_token=0.001, batches=(1, 2)), prior=AcceptanceTracker(prior=(0.16,) * 8),
                           repick_every=1, probe_every=6, max_probe_every=6, batched_margin=1.02,
                           batched_probe_optimism=1.5, sampled_margin=1.02)
    d.pools[True] = AcceptanceTracker(prior=(0.16,) * 8)  # sampled requests start from their own pool
    seen = []
    observe = d.observe_look_back
    d.observe_look_back = lambda rows, hits, tries: seen.append((list(rows), list(hits), list(tries))) or \
        observe(rows, hits, tries)
    lazy = prop.EagleProposer(head, d)
    labels = []
    propose = lazy.propose
    lazy.propose = lambda *a, **k: (propose(*a, **k), labels.append(lazy.step_label))[0]
    got = run(lazy)
    # the probe at step 5 scores pairs j = 1, 2, 3: pair j's q against the token of step j + 1 (out[j + 2])
    t2d = lazy._target_to_draft()
    want = [sum(min(1.0, float(q_after[r][j][t2d[out[r][j + 2]]]) / p_bonus[r][j + 1]) if t2d[out[r][j + 2]] >= 0
                else 0.0 for j in range(1, 4)) for r in (0, 1)]
    assert seen, labels
    rows, hits, tries = seen[0]
    assert rows == [0, 1] and tries == [3, 3]
    assert hits == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert 0 < min(want) and max(want) < 3  # neither a sure hit nor a sure miss: q and p both count
    assert "chain1" not in labels[:6]  # the probe (step 5) drafted nothing
    first = labels.index("chain1") if "chain1" in labels else len(labels)
    assert all(a[:first + 1] == b[:first + 1] for a, b in zip(got, out))  # vanilla's tokens until drafting


def test_a_look_back_weighs_as_many_verifications_of_depth_one():
    t = AcceptanceTracker(decay=0.9, prior=(0.5, 0.4), weight=10.0)
    s = AcceptanceTracker(decay=0.9, prior=(0.5, 0.4), weight=10.0)
    t.update_first(1, 4)
    for k in (0, 1, 0, 0):  # the same evidence one verification at a time (the order changes only the weights)
        s.update_chain(1, k)
    assert t.tries == pytest.approx(s.tries) and t.rates()[1] == pytest.approx(0.4)
    w = (1 - 0.9 ** 4) / 0.1
    assert t.hits[0] == pytest.approx(5 * 0.9 ** 4 + w / 4) and t.rates()[0] < 0.5
    t.update_first(0, 0)  # nothing scored: nothing changes
    assert t.tries == pytest.approx(s.tries)
    with pytest.raises(ValueError, match="hits"):
        t.update_first(5, 4)


def test_a_paused_dispatcher_looks_back_instead_of_drafting_and_resumes_on_what_it_saw():
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = flat_costs(per_token=0.001)  # chain 1 pays above ~21% depth-1 acceptance
    d = AdaptiveDispatcher(costs, [Chain(1), Chain(2)], prior=AcceptanceTracker(prior=(0.15, 0.15), weight=50.0),
                           repick_every=1, probe_every=4, max_probe_every=8)
    d.start_row(0)
    due = []
    for step in range(12):
        cfg = d.pick(1, [0], look_back=True)
        assert not cfg.drafts  # a look-back probe keeps the step plain
        due.append(d.look_back_due)
        if d.look_back_due:
            d.observe_look_back([0], [1], [8])  # the head rarely right on the recorded pairs
    assert [s for s, x in enumerate(due) if x] == [3, 11]  # after 4 paused steps, then 8 (the wait doubled)
    assert not d.pick(1, [0], look_back=True).drafts
    for _ in range(7):
        d.pick(1, [0], look_back=True)
    assert d.look_back_due
    d.observe_look_back([0], [30], [32])  # acceptance recovered
    assert d.pick(1, [0], look_back=True).drafts  # chosen again at the next step: drafting resumes
    assert d.rows[0].rates()[0] > 0.5


def test_a_paused_dispatcher_does_not_probe_where_no_plausible_recovery_would_pay():
    """A probe costs a catch-up over every paused pair; it is skipped where even 1.5 x the rows' acceptance would
    not make a tree pay (a large batch with a weak head), and made where it would (the same head at batch 1)."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = flat_costs(per_token=0.004, batches=(1, 4))  # break-even depth-1 acceptance: ~0.38 at 1, ~0.5 at 4
    for batch, probes in ((4, 0), (1, 3)):
        d = AdaptiveDispatcher(costs, [Chain(1), Chain(2)], prior=AcceptanceTracker(prior=(0.3, 0.3), weight=1e6),
                               repick_every=1, probe_every=4, max_probe_every=16)
        rows = list(range(batch))
        for r in rows:
            d.start_row(r)
        seen = 0
        for _ in range(40):
            assert not d.pick(batch, rows, look_back=True).drafts
            if d.look_back_due:
                seen += 1
                d.observe_look_back(rows, [2] * batch, [8] * batch)
        assert seen == probes, (batch, seen)  # at batch 1: after 4, 8 and 16 paused steps
    with pytest.raises(ValueError, match="probe_optimism"):
        AdaptiveDispatcher(costs, probe_optimism=0.5)


def test_a_paused_dispatcher_does_not_probe_where_too_few_tokens_are_left_to_repay_it():
    """A resume at the hopeful speedup S over the R tokens a row has left saves R * (1 - 1/S) plain steps; a
    probe costs about one (its catch-up): due probes are skipped (and the wait doubles, as after a failed one)
    where the longest budget cannot repay it, and made where it can; no budget: probes as before."""
    from eaglespec.spec import dispatch
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = flat_costs(per_token=0.004, batches=(1, 4))

    def probes(budget_of):  # budget_of(step) -> the rows' budgets at that step
        d = AdaptiveDispatcher(costs, [Chain(1), Chain(2)], prior=AcceptanceTracker(prior=(0.3, 0.3), weight=1e6),
                               repick_every=1, probe_every=4, max_probe_every=16, batched_margin=1.02,
                               batched_probe_optimism=1.5)
        d.start_row(0)
        d.start_row(1)
        at = []
        for step in range(40):
            assert not d.pick(2, [0, 1], look_back=True, budget=budget_of(step)).drafts
            if d.look_back_due:
                at.append(step)
                d.observe_look_back([0, 1], [2, 2], [8, 8])
        return at, d

    everywhere, d = probes(lambda step: None)
    assert everywhere == [3, 11, 27]
    hopeful = d._batch_tracker([0, 1]).rates()
    speedup = dispatch.choose(costs, 2, d._shapes, AcceptanceTracker(1.0, tuple(min(1.0, 1.5 * r) for r in hopeful),
                                                                      1.0), d.margin, None).predicted_speedup
    enough = math.ceil(dispatch.PROBE_COST_STEPS / (1 - 1 / speedup))  # tokens left that repay a probe
    assert probes(lambda step: (enough, 1))[0] == everywhere  # the row with the most left decides
    assert probes(lambda step: (enough - 1, enough - 1))[0] == []  # none of them is worth its catch-up
    assert probes(lambda step: (27 + enough - 1 - step,) * 2)[0] == [3, 11]  # the third comes too late
    assert 10 < enough < 100  # the rows of 128-token requests probe, but not in their last tokens


def test_a_timed_catch_up_prices_the_next_probes_at_the_pairs_they_would_encode():
    """Until a catch-up was timed a probe costs ``PROBE_COST_STEPS``; after one, the pairs the proposer says its
    catch-up would encode, at the timed seconds a pair (decayed over timings), against a plain step at this
    batch size and context: a probe that would encode more than a resume could win back is skipped."""
    from eaglespec.spec import dispatch
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = flat_costs(per_token=0.004, batches=(1, 4))
    plain = costs.verify_cost(2, 1)

    def dispatcher():
        d = AdaptiveDispatcher(costs, [Chain(1), Chain(2)], prior=AcceptanceTracker(prior=(0.3, 0.3), weight=1e6),
                               repick_every=1, probe_every=4, max_probe_every=4, batched_margin=1.02,
                               batched_probe_optimism=1.5)
        d.start_row(0)
        d.start_row(1)
        return d

    d = dispatcher()
    assert d.probe_cost(2, [0, 1], lambda: 1000) == dispatch.PROBE_COST_STEPS  # nothing timed yet
    d.observe_catch_up(500, 500 * 0.0002)  # 0.2 ms a pair
    assert d.probe_cost(2, [0, 1], lambda: 1000) == pytest.approx(1000 * 0.0002 / plain)
    assert d.probe_cost(2, [0, 1], None) == dispatch.PROBE_COST_STEPS  # no count: the constant
    d.observe_catch_up(100, 100 * 0.0006)  # the earlier timing weighs 0.75
    assert d.probe_cost(2, [0, 1], lambda: 10) == pytest.approx(
        10 * (0.75 * 0.1 + 0.06) / (0.75 * 500 + 100) / plain)
    d.observe_catch_up(0, 1.0)  # nothing encoded: no price
    assert d.probe_cost(2, [0, 1], lambda: 10) == pytest.approx(
        10 * (0.75 * 0.1 + 0.06) / (0.75 * 500 + 100) / plain)
    for pairs, seconds in ((-1, 0.1), (10, -0.1), (10, float("nan")), (float("inf"), 0.1)):
        with pytest.raises(ValueError, match="catch-up"):
            d.observe_catch_up(pairs, seconds)

    def probes(pairs, budget=64):
        d = dispatcher()
        d.observe_catch_up(1000, 1000 * 0.0002)
        asked = []
        at = []
        for step in range(20):
            assert not d.pick(2, [0, 1], look_back=True, budget=(budget, budget),
                              catch_up=lambda: asked.append(step) or pairs).drafts
            if d.look_back_due:
                at.append(step)
                d.observe_look_back([0, 1], [2, 2], [8, 8])
        return at, asked

    hopeful = dispatcher()
    speedup = dispatch.choose(costs, 2, hopeful._shapes, AcceptanceTracker(1.0, (0.45, 0.45), 1.0), 1.02,
                              None).predicted_speedup
    worth = 64 * (1 - 1 / speedup) * plain / 0.0002  # the most pairs a probe may encode and be repaid
    cheap, asked = probes(int(worth * 0.9))
    assert cheap == [3, 7, 11, 15, 19] and asked == cheap  # counted only when a probe is due
    assert probes(int(worth * 1.1)) == ([], [3, 7, 11, 15, 19])  # skipped: the catch-up outweighs a resume
    assert 1 < worth * 0.0002 / plain < 64


def test_a_batch_of_several_requests_drafts_only_past_the_batched_margin():
    """Alone in its batch a request drafts a tree predicted 1.05x (above ``margin``, 1.02); in a batch of several
    the same prediction stays paused (``BATCHED_MARGIN``, 1.10: the calibration's batched prices err more) unless
    the margin is lowered; a tree predicted above it drafts in the batch too. Bad margins are refused."""
    from eaglespec.spec import dispatch
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = CostTable({(b, n): 0.010 for b in (1, 4) for n in (1, 2)}, {(b, "chain1"): 0.0 for b in (1, 4)})

    def picks(rate, **kw):
        d = AdaptiveDispatcher(costs, [Chain(1)], prior=AcceptanceTracker(prior=(rate,), weight=1e6), repick_every=1,
                               **kw)
        return d.pick(1, [0]).label, d.pick(4, [0, 1, 2, 3]).label, round(d.last.predicted_speedup, 3)

    assert dispatch.BATCHED_MARGIN == 1.10
    assert picks(0.05) == ("chain1", "none", 1.0)  # chain 1 predicted 1.05x: drafted alone, paused in a batch
    assert picks(0.05, batched_margin=1.02) == ("chain1", "chain1", 1.05)
    assert picks(0.15) == ("chain1", "chain1", 1.15)
    with pytest.raises(ValueError, match="margins must be >= 1"):
        AdaptiveDispatcher(costs, [Chain(1)], batched_margin=0.9)


def test_a_request_alone_that_drafts_pauses_only_on_a_predicted_loss():
    """Hysteresis at batch 1 (``KEEP_MARGIN``): the chain of 1 breaks even at depth-1 acceptance 0.3 here and
    starts past 0.326 (margin 1.02); a drafting request whose acceptance falls keeps drafting down to 0.274 (a
    predicted 2% loss), where without the keep margin it paused below 0.326. A paused request still needs the
    full margin to resume, and a batch of several keeps its batched margin both ways."""
    from eaglespec.spec import dispatch
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = CostTable({(b, n): 0.010 * (1.3 if n == 2 else 1.0) for b in (1, 4) for n in (1, 2)},
                      {(b, "chain1"): 0.0 for b in (1, 4)})

    def rate_at_pause(batch=1, **kw):
        """Depth-1 acceptance at which a request drafting from 0.5 pauses as misses come in."""
        rows = list(range(batch))
        d = AdaptiveDispatcher(costs, [Chain(1)], prior=AcceptanceTracker(prior=(0.5,), weight=8), repick_every=1,
                               probe_every=1000, max_probe_every=1000, batched_margin=1.02, **kw)
        for r in rows:
            d.start_row(r)
        assert d.pick(batch, rows).label == "chain1"
        for _ in range(200):
            d.observe(rows, Chain(1), [0] * batch)
            if d.pick(batch, rows).label == "none":
                return d, d._batch_tracker(rows).rates()[0]
        raise AssertionError("never paused")

    assert dispatch.KEEP_MARGIN == 0.98
    d, kept = rate_at_pause()
    _, plain = rate_at_pause(keep_margin=None)
    assert 0.26 < kept < 0.274 < 0.31 < plain < 0.326
    assert rate_at_pause(4)[1] == pytest.approx(plain)  # a batch of 4: no hysteresis
    # paused at 0.27: a look-back at 0.31 (between the thresholds) leaves it paused, one at 0.5 resumes it
    d.observe_look_back([0], [0.31 * 32], [32])
    assert 0.28 < d._batch_tracker([0]).rates()[0] < 0.326 and d.pick(1, [0]).label == "none"
    d.observe_look_back([0], [0.5 * 32], [32])
    assert d.pick(1, [0]).label == "chain1"
    with pytest.raises(ValueError, match="keep_margin"):
        AdaptiveDispatcher(costs, [Chain(1)], keep_margin=1.05)


def test_a_chain_whose_next_depth_went_unseen_drafts_the_longer_chain_for_a_run():
    """A request alone drafts the chain of 1 (predicted 1.20x against the chain of 2's 1.155x from a depth-2 rate of
    0.35 that no chain of 1 ever updates). Once that rate rests on less than one verification's worth of evidence
    (``DEEPEN_BELOW``) and the chain of 2 would pay at 1.5 times it, the chain of 2 is drafted for ``DEEPEN_STEPS``
    steps: here its second tokens are always accepted, so it is kept. A depth-2 rate too low to matter even for an
    optimist (0.1) is never explored; ``deepen_steps=0`` never explores; a batch of several never does."""
    from eaglespec.spec import dispatch
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = CostTable({(b, n): 0.010 * {1: 1.0, 2: 1.2, 3: 1.35}[n] for b in (1, 4) for n in (1, 2, 3)},
                      {(b, "chain1"): 0.0005 for b in (1, 4)} | {(b, "chain2"): 0.001 for b in (1, 4)})

    def run(depth2, steps=120, batch=1, **kw):
        rows = list(range(batch))
        d = AdaptiveDispatcher(costs, [Chain(1), Chain(2)], prior=AcceptanceTracker(prior=(0.5, depth2), weight=8),
                               repick_every=1, batched_margin=1.02, cost_feedback=False, **kw)
        for r in rows:
            d.start_row(r)
        labels = []
        for i in range(steps):
            cfg = d.pick(batch, rows)
            labels.append(cfg.label)
            first = i % 2 == 0  # half the first tokens accepted; every second token after an accepted first
            d.observe(rows, cfg, [(cfg.depth if first else 0) if cfg.drafts else 0] * batch)
        return labels

    assert (dispatch.DEEPEN_BELOW, dispatch.DEEPEN_STEPS) == (1.0, 8)
    labels = run(0.35)
    first = labels.index("chain2")
    assert 60 < first < 75 and labels[:first] == ["chain1"] * first  # 8 x 0.97^n < 1 after 69 verifications
    assert labels[first:first + 8] == ["chain2"] * 8 and set(labels[first + 8:]) == {"chain2"}  # kept: it pays
    assert set(run(0.1)) == {"chain1"}
    assert set(run(0.35, deepen_steps=0)) == {"chain1"}
    assert set(run(0.35, batch=2)) == {"chain1"}
    with pytest.raises(ValueError, match="deepen_steps"):
        AdaptiveDispatcher(costs, [Chain(1)], deepen_steps=-1)


def test_a_new_request_inherits_no_more_evidence_of_a_depth_than_the_pool_has():
    """``start_row``: the pool's rates with the prior's weight of 8 verifications, except at a depth whose pooled
    evidence weighs less, which passes on its own weight, rate unchanged: after three chains of 2 whose second
    tokens missed and 40 chains of 1 the pool's depth 2 has aged towards nothing, and a new request starts from a
    depth-2 rate read off three tries. With ``pool_memory=True`` the pool ages a depth only as it is tried: depth 2
    stays at what the chains of 2 showed, and a new request takes it at the prior's weight."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = CostTable({(1, 1): 0.01, (1, 2): 0.012, (1, 4): 0.014}, {(1, "chain1"): 0.0, (1, "chain2"): 0.0})

    def pooled(**kw):
        d = AdaptiveDispatcher(costs, [Chain(1), Chain(2)], prior=AcceptanceTracker(prior=(0.5, 0.4), weight=8), **kw)
        d.start_row(0)
        for _ in range(3):
            d.observe([0], Chain(2), [1])  # depth 1 accepted, depth 2 tried and missed
        for _ in range(40):
            d.observe([0], Chain(1), [1])
        d.end_row(0)
        d.start_row(0)
        return d.pools[False], d.rows[0]

    depth2 = (3.2 * 0.97 ** 3, 8 * 0.97 ** 3 + 0.97 ** 2 + 0.97 + 1)
    pool, t = pooled(pool_memory=True)
    assert (pool.hits[1], pool.tries[1]) == pytest.approx(depth2)
    assert pool.tries[0] > 8 and t.tries[0] == 8 and t.tries[1] == 8  # both depths: the prior's weight
    assert t.rates() == pytest.approx(pool.rates())
    pool, t = pooled()
    assert pool.tries[1] == pytest.approx(depth2[1] * 0.97 ** 40) == pytest.approx(t.tries[1])  # aged: passed on as is
    assert t.rates() == pytest.approx(pool.rates())


def test_a_new_request_starts_from_the_spread_of_the_requests_before_it():
    """Once enough requests were counted, a new request's depth-1 acceptance starts at the spread's mean
    (``RequestSpread.prior``) with its strength as weight (at most ``SPREAD_PRIOR_MAX``), not at the pool's rate,
    which the latest request dominates: after four requests at 0.6 and one at 0.05 the pool reads ~0.26 and the next
    request would start paused (the chain of 1 pays above ~0.38 here); from the spread it drafts at once. Sampled
    requests keep a spread of their own; ``spread_prior=False`` restores the pool's start."""
    from eaglespec.spec.dispatch import SPREAD_PRIOR_MAX, AdaptiveDispatcher

    def after(rates, **kw):
        d = AdaptiveDispatcher(flat_costs(per_token=0.004), [Chain(1)], repick_every=1, cost_feedback=False,
                               prior=AcceptanceTracker(prior=(0.6,), weight=8), **kw)
        for rate in rates:
            d.start_row(0)
            d.observe_look_back([0], [32 * rate], [32])
            d.end_row(0)
        d.start_row(0)
        return d

    d = after([0.6] * 4 + [0.05])
    m, k = d.spreads[False].prior()
    assert m == pytest.approx((4 * 0.6 + 0.05) / 5) and 1.0 < k < SPREAD_PRIOR_MAX
    assert d.rows[0].rates()[0] == pytest.approx(m) and d.rows[0].tries[0] == pytest.approx(k)
    assert d.pools[False].rates()[0] < 0.3
    assert d.pick(1, [0]).label == "chain1"
    off = after([0.6] * 4 + [0.05], spread_prior=False)
    assert off.rows[0].rates()[0] == pytest.approx(off.pools[False].rates()[0]) and off.rows[0].tries[0] == 8
    assert off.pick(1, [0]).label == "none"
    alike = after([0.6] * 8)  # requests that agree: the sd floor's strength, capped
    assert alike.rows[0].tries[0] == SPREAD_PRIOR_MAX
    d.start_row(1, sampled=True)  # no sampled request was counted: the sampled pool's start
    assert d.rows[1].rates()[0] == pytest.approx(d.pools[True].rates()[0]) and d.rows[1].tries[0] == 8
    bare = AdaptiveDispatcher(flat_costs(), [Chain(1)], prior=AcceptanceTracker(prior=(), weight=0.0))
    for rate in [0.5] * 4:  # a pool with no prior at all: the spread still sets depth 1
        bare.start_row(0)
        bare.observe_look_back([0], [32 * rate], [32])
        bare.end_row(0)
    bare.pools[False] = AcceptanceTracker(prior=(), weight=0.0)
    bare.start_row(0)
    assert bare.rows[0].rates() == pytest.approx([0.5])


def test_trees_are_timed_at_batch_4_and_priced_between_by_their_ratio_to_a_plain_step(monkeypatch):
    """Tree steps are timed at the smallest and largest batch sizes and at 4; between them, a tree's step is
    priced at the interpolated ratio to a plain step, so a stalled verify(2, 2) does not make it dearer (until
    calibration version 18 the seconds of drafting were interpolated and the stalled forward added to them)."""
    from types import SimpleNamespace

    from eaglespec.engine import calibrate as cal

    asked = []

    def paired(target, proposer, batch, n, prompt, temperature=0.0):  # a tree step: 1.3 plain steps at every batch
        asked.append(batch)
        plain = [0.01 * batch ** 0.5] * 10
        return [1.3 * p for p in plain], plain, None

    monkeypatch.setattr(cal, "_paired_steps", paired)
    monkeypatch.setattr(cal, "_step_times", lambda *a, **k: ([], None))  # the warm-up
    verify = {(b, n): 0.01 * b ** 0.5 * (1.0 + 0.1 * (n - 1)) for b in (1, 2, 4, 8) for n in (1, 2, 4)}
    verify[(2, 2)] = 1.25 * verify[(2, 1)]  # a stall, below the larger forwards' readings
    costs = CostTable(verify, {}, overhead={b: 0.0 for b in (1, 2, 4, 8)})
    assert costs.verify_cost(2, 2) == pytest.approx(1.25 * verify[(2, 1)])
    got = cal.measure_draft(SimpleNamespace(), lambda t: object(), {"chain1": Chain(1)}, (1, 2, 4, 8), costs, reps=1)
    assert sorted(set(asked)) == [1, 4, 8]
    for b in (1, 2, 4, 8):
        assert got[(b, "chain1")] + costs.verify_cost(b, 2) == pytest.approx(1.3 * costs.verify_cost(b, 1))


# ------------------------------------------------------------------------------------- step-cost feedback
def test_step_cost_feedback_reprices_a_shape_relative_to_plain_steps():
    """A shape is corrected by its measured / priced ratio over the plain steps' ratio (plain counted at its price
    until ``plain_weight`` plain steps were timed) once it has ``min_weight`` steps, and only where that makes it
    ``tolerance`` or more dearer; ratios are compared within a band of context only; a machine that got slower or
    faster for every step corrects nothing; one stalled step moves the price by at most its clipped share; bad
    readings and parameters are refused."""
    from eaglespec.spec.costmodel import StepCostFeedback

    f = StepCostFeedback(decay=1.0, min_weight=4, plain_weight=4, age=1.0)
    for _ in range(3):
        f.observe(4, "chain1", 0.013, 0.010)
    assert f.factor(4, "chain1") == 1.0  # 3 steps: not enough evidence
    f.observe(4, "chain1", 0.013, 0.010)
    assert f.factor(4, "chain1") == pytest.approx(1.3)  # no plain step timed: plain assumed at its price
    for _ in range(4):
        f.observe(4, "none", 0.011, 0.010)  # plain steps 10% dearer than priced too
    assert f.factor(4, "chain1") == pytest.approx(1.3 / 1.1)
    for _ in range(4):
        f.observe(4, "none", 0.014, 0.010)  # plain now 1.25 on average: the chain within 1.05 (1.04) of it
    assert f.factor(4, "chain1") == 1.0
    assert f.factor(1, "chain1") == 1.0 and f.factor(4, "none") == 1.0  # per batch size; plain is the reference
    assert f.factors(4) == {"chain1": 1.0} and f.drafted == 4
    assert f.snapshot() == [{"batch": 4, "tree": "chain1", "context": None, "ratio": 1.3, "weight": 4.0, "factor": 1.0},
                            {"batch": 4, "tree": "none", "context": None, "ratio": 1.25, "weight": 8.0, "factor": 1.0}]

    small = StepCostFeedback(decay=1.0, min_weight=4, plain_weight=4, age=1.0)  # 8% dearer relative to plain:
    # past the 5% tolerance
    for _ in range(4):
        small.observe(1, "chain1", 0.0108, 0.010)
        small.observe(1, "none", 0.0100, 0.010)
    assert small.factor(1, "chain1") == pytest.approx(1.08)

    bands = StepCostFeedback(decay=1.0, age=1.0, min_weight=8)  # plain steps timed over long contexts only,
    # where they ran cheap
    for _ in range(20):
        bands.observe(1, "none", 0.0082, 0.010, context=1500)
        bands.observe(1, "chain1", 0.0095, 0.010, context=200)
    assert bands.factor(1, "chain1", 200) == 1.0  # not compared with plain steps of another context band
    for _ in range(20):
        bands.observe(1, "chain1", 0.0095, 0.010, context=1500)
    assert bands.factor(1, "chain1", 1500) == pytest.approx(0.95 / 0.82)  # compared within its band
    assert bands.factors(1, 200) == {"chain1": 1.0} and bands.factors(1, 1400) == {"chain1": pytest.approx(0.95 / 0.82)}
    assert [(e["tree"], e["context"]) for e in bands.snapshot()] == [("chain1", [0, 256]), ("chain1", [1280, 1536]),
                                                                      ("none", [1280, 1536])]

    fast = StepCostFeedback(decay=1.0, age=1.0, min_weight=8)  # everything runs at 0.7x its price
    for _ in range(10):
        fast.observe(1, "chain2", 0.014, 0.020)
        fast.observe(1, "none", 0.007, 0.010)
    assert fast.factor(1, "chain2") == 1.0  # the machine, not the price, changed
    for _ in range(30):
        fast.observe(1, "chain2", 0.010, 0.020)  # the chain now at 0.5x its price, plain at 0.7x
    assert fast.factor(1, "chain2") == 1.0  # cheaper than priced: the price stands

    stall = StepCostFeedback(decay=1.0, tolerance=1.0, age=1.0, min_weight=8)
    for _ in range(9):
        stall.observe(1, "none", 0.010, 0.010)
        stall.observe(1, "chain1", 0.010, 0.010)
    stall.observe(1, "chain1", 1.0, 0.010)  # 100x: counted as 2x
    assert stall.factor(1, "chain1") == pytest.approx(1.1)

    with pytest.raises(ValueError, match="finite and > 0"):
        f.observe(1, "chain1", 0.0, 0.01)
    with pytest.raises(ValueError, match="finite and > 0"):
        f.observe(1, "chain1", math.inf, 0.01)
    with pytest.raises(ValueError, match="0 < decay <= 1"):
        StepCostFeedback(decay=0.0)
    with pytest.raises(ValueError, match="clip >= 1"):
        StepCostFeedback(clip=0.5)
    with pytest.raises(ValueError, match="tolerance >= 1"):
        StepCostFeedback(tolerance=0.9)
    with pytest.raises(ValueError, match="band >= 1"):
        StepCostFeedback(band=0)
    with pytest.raises(ValueError, match="plain_weight >= 0"):
        StepCostFeedback(plain_weight=-1)
    with pytest.raises(ValueError, match="0 < age <= 1"):
        StepCostFeedback(age=0.0)
    with pytest.raises(ValueError, match="0 <= release <= 1"):
        StepCostFeedback(release=1.5)


def test_step_cost_feedback_needs_min_weight_then_holds_a_correction_until_it_ages_out():
    """Session 35's MT-bench miss, replayed: the first request read the chain of 1 at 1.31 of its price over 10
    steps, plain steps at 1.18; with the old ``min_weight`` of 8 that set f = 1.11 and paused the chain for good,
    now it needs 24 steps' worth. A correction that was reached holds while plain steps age it (a paused tree is
    not timed again) and lets go once its weight falls below ``release`` times ``min_weight``: the tree is then
    chosen on its price and timed anew. A reading that never reached ``min_weight`` does not correct on the way
    down either."""
    from eaglespec.spec.costmodel import StepCostFeedback

    def early(**kw):
        f = StepCostFeedback(**kw)
        for _ in range(26):
            f.observe(1, "none", 0.0118, 0.010)
        for _ in range(10):
            f.observe(1, "chain1", 0.0131, 0.010)
        return f

    assert early(min_weight=8).factor(1, "chain1") == pytest.approx(1.31 / 1.18)  # the old rule: paused
    f = early()
    assert f.factor(1, "chain1") == 1.0 and f.ratio(1, "chain1") is None
    for _ in range(13):
        f.observe(1, "chain1", 0.0131, 0.010)
    assert f.ratio(1, "chain1") is None  # weight 21.5: still short of 24
    for _ in range(400):  # aged down from below min_weight: nothing was held
        f.observe(1, "none", 0.0118, 0.010)
    assert f.ratio(1, "chain1") is None

    g = StepCostFeedback()
    for _ in range(30):
        g.observe(1, "none", 0.010, 0.010)
        g.observe(1, "chain1", 0.013, 0.010)
    assert g.factor(1, "chain1") == pytest.approx(1.3)
    w0 = g.snapshot()[0]["weight"]
    assert w0 >= 24
    held = math.floor(math.log(12 / w0) / math.log(0.998))  # plain steps until the weight falls below 12
    for _ in range(held - 1):
        g.observe(1, "none", 0.010, 0.010)
    assert g.factor(1, "chain1") == pytest.approx(1.3)  # weight ~12.0: held since it reached 24
    for _ in range(2):
        g.observe(1, "none", 0.010, 0.010)
    assert g.factor(1, "chain1") == 1.0  # aged out: chosen on its price again
    assert g.snapshot()[0]["weight"] < 12
    for _ in range(15):  # timed anew at the same ratio: corrects again once its weight is back at 24 (16 steps)
        g.observe(1, "chain1", 0.013, 0.010)
        assert g.factor(1, "chain1") == 1.0
    g.observe(1, "chain1", 0.013, 0.010)
    assert g.factor(1, "chain1") == pytest.approx(1.3)

    renewed = StepCostFeedback()
    for _ in range(30):
        renewed.observe(1, "chain1", 0.013, 0.010)
    for _ in range(200):
        renewed.observe(1, "none", 0.010, 0.010)
    renewed.observe(1, "chain1", 0.013, 0.010)  # timed again while held at weight ~17: renewed, not restarted
    assert renewed.snapshot()[0]["weight"] < 24 and renewed.factor(1, "chain1") == pytest.approx(1.3)

    plain = StepCostFeedback()  # plain readings do not age: a batch that drafts times few plain steps
    for _ in range(9):  # weight 8.6
        plain.observe(1, "none", 0.0115, 0.010)
    for _ in range(2000):
        plain.observe(1, "chain1", 0.0115, 0.010)
    assert plain.plain(1) == pytest.approx(1.15) and plain.factor(1, "chain1") == 1.0

    no_age = StepCostFeedback(age=1.0)  # age 1: a reading holds for good
    for _ in range(30):
        no_age.observe(1, "chain1", 0.013, 0.010)
    for _ in range(5000):
        no_age.observe(1, "none", 0.010, 0.010)
    assert no_age.factor(1, "chain1") == pytest.approx(1.3)


def test_step_cost_feedback_takes_plain_steps_of_the_nearest_band_where_its_own_has_none_and_only_upward():
    """Where no plain step was timed in a band, the reference is the larger of the price and the nearest timed
    band's plain ratio: a machine running every step 12% slow does not make a chain that ran 8% slow dearer
    (session 35, MT-bench, 256-511 tokens), and plain steps that ran cheap elsewhere do not lower the
    reference."""
    from eaglespec.spec.costmodel import StepCostFeedback

    f = StepCostFeedback()
    for _ in range(40):
        f.observe(1, "none", 0.0112, 0.010, context=100)
        f.observe(1, "chain1", 0.0108, 0.010, context=300)
        f.observe(1, "none", 0.0090, 0.010, context=1300)
    assert f.plain(1, 300) == pytest.approx(1.12) and f.factor(1, "chain1", 300) == 1.0  # band 0 is nearer
    assert f.plain(1, 1100) == 1.0  # band 5 (0.90) is nearest: the price stands
    assert f.plain(1, 1300) == pytest.approx(0.90) and f.plain(1, 100) == pytest.approx(1.12)  # their own bands
    assert f.plain(1, None) == 1.0 and f.plain(2, 300) == 1.0  # no band, other batch size: nothing timed
    for _ in range(40):
        f.observe(1, "chain1", 0.0125, 0.010, context=900)  # nearest plain: band 5 (0.90) -> the price
    assert f.factor(1, "chain1", 900) == pytest.approx(1.25)


def test_step_cost_feedback_compares_a_tree_with_the_other_trees_read_in_its_band():
    """Session 36's AlpacaEval run, replayed: the chain of 1 read 1.036 of its price, the chain of 2 1.204 and plain
    steps 1.160; against plain steps alone the chain of 2 is within tolerance (1.04), against the chain of 1 it is
    1.16 dearer than priced. A peer counts only where its own reading corrects (``min_weight``), in the same band at
    the same batch size; the cheaper tree keeps its price; ``peers=False`` compares with plain steps only."""
    from eaglespec.spec.costmodel import StepCostFeedback

    def replay(**kw):
        f = StepCostFeedback(age=1.0, **kw)
        for _ in range(30):
            f.observe(1, "none", 0.01160, 0.010, context=100)
        for _ in range(120):
            f.observe(1, "chain1", 0.01036, 0.010, context=100)
            f.observe(1, "chain2", 0.01204, 0.010, context=100)
        return f

    f = replay()
    assert f.factor(1, "chain2", 100) == pytest.approx(1.204 / 1.036)
    assert f.factor(1, "chain1", 100) == 1.0  # cheaper than its peer and plain steps: its price stands
    assert f.factors(1, 100) == {"chain1": 1.0, "chain2": pytest.approx(1.204 / 1.036)}
    assert f.factor(1, "chain2", 300) == 1.0 and f.factor(4, "chain2", 100) == 1.0  # nothing read there
    assert replay(peers=False).factor(1, "chain2", 100) == 1.0  # 1.204 / 1.160 = 1.04: within tolerance

    light = StepCostFeedback(age=1.0)  # the peer's reading short of min_weight (24) does not count
    for _ in range(30):
        light.observe(1, "none", 0.0116, 0.010, context=100)
        light.observe(1, "chain2", 0.01204, 0.010, context=100)
    for _ in range(27):  # weight 23.8
        light.observe(1, "chain1", 0.01036, 0.010, context=100)
    assert light.factor(1, "chain2", 100) == 1.0
    light.observe(1, "chain1", 0.01036, 0.010, context=100)  # 24.5
    assert light.factor(1, "chain2", 100) == pytest.approx(1.204 / 1.036)

    apart = StepCostFeedback(age=1.0)  # the cheap readings in another band, at another batch size
    for _ in range(40):
        apart.observe(1, "none", 0.0116, 0.010, context=100)
        apart.observe(1, "chain2", 0.01204, 0.010, context=100)
        apart.observe(1, "chain1", 0.01036, 0.010, context=300)
        apart.observe(4, "chain1", 0.01036, 0.010, context=100)
    assert apart.factor(1, "chain2", 100) == 1.0


def _priced_wrong(cost_feedback: bool, engine_ratio: float, steps: int = 40) -> list[str]:
    """A dispatcher whose calibration prices a chain-of-1 step at 1.3 plain steps (predicted 1.5 / 1.3 = 1.15x at
    acceptance 0.5) on an engine where it costs ``engine_ratio`` plain steps; its picks, step by step."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = CostTable({(1, 1): 0.010, (1, 2): 0.013}, {(1, "chain1"): 0.0})
    d = AdaptiveDispatcher(costs, [Chain(1)], prior=AcceptanceTracker(prior=(0.5,), weight=1e6), repick_every=1,
                           probe_every=1000, max_probe_every=1000, cost_feedback=cost_feedback)
    d.start_row(0)
    picks = []
    for _ in range(steps):
        cfg = d.pick(1, [0])
        picks.append(cfg.label)
        if cfg.drafts:
            d.observe([0], cfg, [1])
        d.observe_step(1, 0.010 * (engine_ratio if cfg.drafts else 1.0))
    return picks


def test_a_tree_the_calibration_priced_too_cheap_is_dropped_once_its_steps_are_timed():
    """Priced at 1.3 plain steps, run at 1.6 (predicted 1.15x, actually 0.94x): with the feedback the dispatcher
    stops drafting after the ``min_weight`` drafting steps its correction needs (decayed by 0.99 and aged by
    0.998 a step), and stays paused; its prediction for the chain is then the measured one. Without it, it drafts
    on. Run where the price was right, it drafts on either way, and the chain's corrected price does not compound
    (the ratio is taken against the calibrated price, not the corrected one)."""
    fed = _priced_wrong(True, 1.6)
    assert fed[:29] == ["chain1"] * 29 and set(fed[29:]) == {"none"}  # 29 steps weigh 24.6 >= min_weight 24
    assert set(_priced_wrong(False, 1.6)) == {"chain1"}
    assert set(_priced_wrong(True, 1.3, steps=200)) == {"chain1"}

    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = CostTable({(1, 1): 0.010, (1, 2): 0.013}, {(1, "chain1"): 0.0})
    d = AdaptiveDispatcher(costs, [Chain(1)], prior=AcceptanceTracker(prior=(0.5,), weight=1e6), repick_every=1)
    d.start_row(0)
    for _ in range(30):
        assert d.pick(1, [0]).label == "chain1"
        d.observe([0], Chain(1), [1])
        d.observe_step(1, 0.0143)  # 1.1x its price (past the tolerance): still ~1.5 / 1.43 = 1.05x, above the margin
    assert d.last.factor == pytest.approx(1.1, rel=1e-9)
    assert d.last.predicted_speedup == pytest.approx(1.5 / 1.43, rel=1e-4)
    assert d.last.step_s == pytest.approx(0.0143)


def test_the_engine_times_each_step_and_leaves_out_the_ones_that_caught_the_draft_cache_up():
    """Through the engine: every drafting step's wall time reaches the dispatcher and one paused step in
    PLAIN_TIMED_EVERY (counting every paused step), except steps whose propose() ran a catch-up of the draft cache
    (a request's first drafting step, a look-back probe): their time is not the chosen tree's cost. Greedy output
    stays the target's."""
    from eaglespec.spec.dispatch import AdaptiveDispatcher
    from eaglespec.spec.proposer import PLAIN_TIMED_EVERY, EagleProposer
    from helpers import tiny_target, tiny_tokenizer
    from test_speculative import PROMPTS, make_head

    target, _ = tiny_target("llama")
    prompts = [tiny_tokenizer().encode(p) for p in PROMPTS[:2]]
    d = AdaptiveDispatcher(flat_costs(batches=(1, 2)), repick_every=2, probe_every=3)
    proposer = EagleProposer(make_head(target, "eagle3"), d)
    timed, steps = [], []  # steps: [drafted, caught up, timed] per propose()
    orig_observe, orig_catch_up, orig_propose = d.observe_step, proposer._catch_up, proposer.propose

    def propose(*a, **k):
        steps.append([False, False, False])
        tree = orig_propose(*a, **k)
        steps[-1][0] = proposer.step_label != "none"
        return tree

    d.observe_step = lambda b, s: timed.append((b, s)) or steps[-1].__setitem__(2, True) or orig_observe(b, s)
    proposer._catch_up = lambda *a, **k: steps[-1].__setitem__(1, True) or orig_catch_up(*a, **k)
    proposer.propose = propose
    assert _greedy_runs(target, proposer, prompts) == _greedy_runs(target, None, prompts)
    plain = [i for i, (drafted, _, _) in enumerate(steps) if not drafted]
    expected = [not caught and (drafted or plain.index(i) % PLAIN_TIMED_EVERY == 0)
                for i, (drafted, caught, _) in enumerate(steps)]
    assert any(c for _, c, _ in steps) and any(d for d, _, _ in steps) and len(plain) > PLAIN_TIMED_EVERY
    assert [t for _, _, t in steps] == expected
    assert all(s > 0 for _, s in timed) and {b for b, _ in timed} <= {1, 2}
    assert d.feedback.ratios  # the prices were checked
    off = AdaptiveDispatcher(flat_costs(batches=(1, 2)), cost_feedback=False)
    assert off.feedback is None
    off.observe_step(1, 0.01)  # nothing to check against: ignored


@pytest.mark.parametrize("seed", range(6))
def test_a_quiet_paused_pick_is_the_whole_pick(seed):
    """A paused batch's picks taken by ``_quiet_step`` (nothing chosen on changed, no probe due) are what the
    whole pick returns: two dispatchers driven by the same seeded script (acceptance that collapses and recovers,
    contexts crossing buckets, rows leaving and joining, look-backs, catch-ups, timed steps), one of them never
    taking the quiet path, return the same trees, probes, predictions and counters at every step; and the quiet
    path was taken."""
    import random

    from eaglespec.spec.dispatch import AdaptiveDispatcher

    def make():
        return AdaptiveDispatcher(flat_costs(batches=(1, 2, 4)), repick_every=4, probe_every=3, max_probe_every=24)

    fast, slow = make(), make()
    slow._quiet_step = lambda *a: False
    quiet = []
    orig = fast._quiet_step
    fast._quiet_step = lambda *a: quiet.append(orig(*a)) or quiet[-1]
    rng = random.Random(seed)
    rows, context, rate = [0], 40.0, 0.9
    for d in (fast, slow):
        d.start_row(0, sampled=seed % 2 == 1)
    for step in range(800):
        if step % 150 == 0:
            rate = rng.choice([0.05, 0.9])
        event = rng.random()
        if event < 0.03:  # a request ends; another takes its row, joins in a new row, or none does
            gone, sampled = rng.choice(rows), rng.random() < 0.5
            new = gone if event < 0.01 else max(rows) + 1 if event < 0.02 and len(rows) < 4 else None
            for d in (fast, slow):
                d.end_row(gone)
                if new is not None:
                    d.start_row(new, sampled=sampled)
            rows = sorted({*rows, *([new] if new is not None else [])} - ({gone} - {new}))
            if not rows:
                rows = [0]
                for d in (fast, slow):
                    d.start_row(0, sampled=sampled)
        context += 1.0
        budget = [rng.randrange(1, 200)] * len(rows)
        waiting = lambda: 300.0  # noqa: E731
        picked = [d.pick(len(rows), list(rows), context, look_back=True, budget=budget, catch_up=waiting,
                         resume=waiting) for d in (fast, slow)]
        assert picked[0].label == picked[1].label, step
        assert fast.look_back_due == slow.look_back_due and fast.step == slow.step and fast.last == slow.last
        assert (fast._steps, fast._since_draft, fast._probe_wait) == (slow._steps, slow._since_draft, slow._probe_wait)
        accepted = [int(rng.random() < rate) for _ in rows]
        hits = [rate * 20.0 for _ in rows]
        seconds = 0.010 + 0.002 * rng.random()
        for d in (fast, slow):
            if picked[0].drafts:
                d.observe(rows, picked[0], accepted)
            if d.look_back_due:
                d.observe_look_back(rows, hits, [20] * len(rows))
                d.observe_catch_up(300.0, 0.004)
            d.observe_step(len(rows), seconds)
    assert quiet.count(True) > 30 and False in quiet


def test_a_quiet_paused_batch_chooses_again_when_a_request_in_it_changes():
    """A paused batch whose picks are quiet (``_quiet_step``) chooses again once a request ends and a sampled one
    takes its row (the same rows, now priced as a sampled batch), as the whole pick does."""
    import dataclasses

    from eaglespec.spec.dispatch import AdaptiveDispatcher

    costs = dataclasses.replace(flat_costs(batches=(1, 2)), sampled_overhead={1: 0.002, 2: 0.003})
    d = AdaptiveDispatcher(costs, margin=100.0, batched_margin=100.0, probe_every=10**6, max_probe_every=10**6)
    d.start_row(0)
    d.start_row(1)
    for i in range(9):
        assert d.pick(2, [0, 1], 100.0 + i).label == "none"
    greedy = d.last
    assert d._quiet is not None and d.pick(2, [0, 1], 110.0) == d.none and d.last is greedy  # quiet
    d.end_row(1)
    d.start_row(1, sampled=True)
    for i in range(d.repick_every):
        d.pick(2, [0, 1], 111.0 + i)
    assert d.last.step_s == pytest.approx(d._sampled_costs.verify_cost(2, 1, 114.0))
    assert d.last.step_s > greedy.step_s
