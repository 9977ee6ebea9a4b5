"""The in-process A/B protocol (measure/ab.py): arms rotate per group, the first group is a warm-up, totals and
outputs are per arm; checked by hand on fake engines that log their calls."""

import json
from types import SimpleNamespace

import pytest

from eaglespec.measure import ab
from eaglespec.measure.ab import arm_engine, first_turn_requests, rotate_arms


class FakeEngine:
    def __init__(self, name, log, draft_s):
        self.name, self.log, self.draft_s = name, log, draft_s

    def generate(self, group):
        self.log.append((self.name, tuple(group)))
        stats = lambda r: SimpleNamespace(draft_s=self.draft_s, verify_s=0.01 * r, tree_rounds={"none": r})
        return [SimpleNamespace(token_ids=[r, r], stats=stats(r)) for r in group]


def test_arms_rotate_per_group_and_the_first_group_is_a_warm_up():
    log, hooks = [], []
    arms = {n: FakeEngine(n, log, d) for n, d in (("a", 0.0), ("b", 1.0), ("c", 2.0))}
    tot = rotate_arms(arms, [1, 2, 3, 4, 5], 2, 2, before=lambda n: hooks.append(("before", n)),
                      after=lambda n: hooks.append(("after", n)))
    # pass p, group g starts at arm (7 p + g) mod 3: pass 0 -> a, b, c; pass 1 -> b, c, a
    starts = [log[i][0] for i in range(0, len(log), 3)]
    assert starts == ["a", "b", "c", "b", "c", "a"]
    assert [g for n, g in log if n == "a"] == [(1, 2), (3, 4), (5,)] * 2
    assert hooks[:2] == [("before", "a"), ("after", "a")] and len(hooks) == 2 * len(log)
    # warm-up (pass 0, group 0) not counted: 4 + 1 tokens in pass 0's later groups, 10 in pass 1
    assert {n: t.tokens for n, t in tot.items()} == {"a": 16, "b": 16, "c": 16}
    assert tot["b"].decode_s == pytest.approx(5 * 1.0 + 0.01 * (4 + 5 + 2 + 4 + 5))  # the longest row a group
    assert tot["a"].rounds == {"none": 3 + 4 + 5 + 1 + 2 + 3 + 4 + 5}
    assert tot["c"].outputs == {i: [r, r] for i, r in enumerate([1, 2, 3, 4, 5])}


def test_nonsense_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="batch >= 1"):
        rotate_arms({"a": FakeEngine("a", [], 0.0)}, [1], 0, 1)
    with pytest.raises(ValueError, match="an arm"):
        rotate_arms({}, [1], 1, 1)


class ChatTokenizer:
    """Renders a chat as "<role>content" pieces and encodes each character as its code point."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode(self, text, add_special_tokens):
        assert not add_special_tokens
        return [ord(c) for c in text]


def test_first_turn_requests_take_each_categorys_first_questions_with_seeds_by_index(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [("a", ["a1", "a1 again"]), ("b", ["b1"]), ("a", ["a2"]), ("a", ["a3"]), ("b", ["b2"])]
    path.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": t}) + "\n"
                            for i, (c, t) in enumerate(rows)))
    reqs = first_turn_requests(ChatTokenizer(), str(path), 2, 0.7, max_new_tokens=9)
    texts = ["".join(map(chr, r.prompt_ids)) for r in reqs]
    assert texts == [f"<user>{q}<assistant>" for q in ("a1", "b1", "a2", "b2")]  # file order, two a category
    assert [r.config.sampling.seed for r in reqs] == [0, 1, 2, 3]
    settings = {(r.config.max_new_tokens, r.config.ignore_eos, r.config.sampling.temperature) for r in reqs}
    assert settings == {(9, True, 0.7)}
    with pytest.raises(ValueError, match="per_category must be >= 1"):
        first_turn_requests(ChatTokenizer(), str(path), 0, 0.7)


def test_arms_are_built_by_name_and_nonsense_is_refused(monkeypatch):
    """``arm_engine``: vanilla without a proposer, chain<D> a fixed chain of D, auto the calibrated dispatcher with
    ATTR=VALUE literals set on it (ATTR.ATTR on one of its attributes); an unknown arm, settings on an arm other
    than auto, an attribute the dispatcher (or the attribute named) lacks, an attribute that is None and a value
    that is not a literal are refused by name."""
    built = []
    monkeypatch.setattr(ab, "Engine", lambda target, prop, max_batch_size: SimpleNamespace(
        target=target, proposer=prop, batch=max_batch_size))
    monkeypatch.setattr(ab, "build_proposer", lambda target, opts: built.append(("fixed", opts)) or "fixed")
    monkeypatch.setattr(ab, "build_calibrated_proposer", lambda target, opts: built.append(("auto", opts)) or
                        SimpleNamespace(dispatcher=SimpleNamespace(margin=1.02, spread_probes=True, probe_every=16,
                                                                   feedback=SimpleNamespace(peers=True), none=None)))
    v = arm_engine("T", "vanilla", 4)
    assert (v.target, v.proposer, v.batch) == ("T", None, 4) and not built
    c = arm_engine("T", "chain3", 1)
    assert c.proposer == "fixed" and built[-1][1].tree == "chain" and built[-1][1].depth == 3
    a = arm_engine("T", "auto:margin=1.05,spread_probes=False,probe_every=1000000", 1)
    d = a.proposer.dispatcher
    assert (d.margin, d.spread_probes, d.probe_every) == (1.05, False, 1000000) and built[-1][0] == "auto"
    assert arm_engine("T", "auto", 1).proposer.dispatcher.margin == 1.02
    assert arm_engine("T", "auto:feedback.peers=False", 1).proposer.dispatcher.feedback.peers is False
    for bad, match in (("chain0", "unknown arm"), ("vanila", "unknown arm"), ("chain1:margin=1", "unknown arm"),
                       ("auto:nosuch=1", "'nosuch=1' is not ATTR=VALUE"), ("auto:margin", "is not ATTR=VALUE"),
                       ("auto:feedback.nosuch=1", "is not ATTR=VALUE"), ("auto:nosuch.peers=1", "is not ATTR=VALUE"),
                       ("auto:none.peers=1", "is not ATTR=VALUE"),
                       ("auto:margin=lambda: 1", "not a Python literal")):
        with pytest.raises(ValueError, match=match):
            arm_engine("T", bad, 1)
