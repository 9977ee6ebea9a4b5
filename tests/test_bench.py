"""Benchmark suite: metric definitions on hand-made records, method parsing, dataset formats, a tiny-model
bench run (records, report, plots), resume, greedy mismatch detection, cost curve and diagnostics."""

import gzip
import json

import pytest
import torch
from helpers import quick_calibration, tiny_tokenizer

from eaglespec.measure import bench
from eaglespec.measure import report
from eaglespec.cli import main
from eaglespec.datasets import DatasetError, encode_conversation, load_questions
from eaglespec.engine.stats import SequenceStats


# ============================================================================================ metrics
def rec(method, qid, new, forwards, wall, acc=None, depth=0, batch_n=1, cat="c", **kw):
    r = {"dataset": "d", "question_id": str(qid), "turn": 1, "method": method, "batch_size": batch_n,
         "temperature": 0.0, "seed": 0, "category": cat, "method_kind": method.split(":")[0],
         "exact": method != "vanilla", "new_tokens": new, "target_forwards": forwards, "wall_s": wall,
         "batch_wall_s": wall * batch_n, "batch_n": batch_n, "accepted_per_position": acc, "tree_depth": depth,
         "tree_nodes": depth + 1, "token_ids": list(range(new)), "prefill_s": None, "draft_s": None, "verify_s": None}
    r.update(kw)
    return r


def test_metrics_match_hand_computed_values():
    vanilla = [rec("vanilla", 1, 11, 10, 1.0, []), rec("vanilla", 2, 11, 10, 1.0, [])]
    eagle = [rec("eagle", 1, 11, 4, 0.5, [4, 2], depth=3), rec("eagle", 2, 11, 6, 0.5, [5, 3, 1], depth=3)]
    # tau = decode tokens / verification forwards = (10 + 10) / (4 + 6)
    assert report.tau(eagle) == pytest.approx(2.0)
    assert report.tau(vanilla) == pytest.approx(1.0)
    # acceptance(d) = rounds with depth d accepted / all rounds: (4+5)/10, (2+3)/10, (0+1)/10
    assert report.acceptance_by_position(eagle) == pytest.approx([0.9, 0.5, 0.1])
    # no acceptance at all still reports every depth of the tree, as zeros
    assert report.acceptance_by_position([rec("eagle", 1, 5, 4, 1.0, [], depth=2)]) == [0.0, 0.0]
    assert report.tokens_per_s(vanilla) == pytest.approx(22 / 2.0)
    assert report.speedup(eagle, vanilla) == pytest.approx((22 / 1.0) / (22 / 2.0))
    # only prompts both methods ran count: an unmatched fast record changes nothing
    assert report.speedup(eagle + [rec("eagle", 3, 100, 1, 0.01)], vanilla) == pytest.approx(2.0)
    # batch > 1: a record accounts for its group's wall divided by the prompts in the group
    batched = [rec("vanilla", i, 10, 9, 0.0, batch_n=2, batch_wall_s=2.0) for i in (1, 2)]
    assert report.tokens_per_s(batched) == pytest.approx(20 / 2.0)
    # batch scaling compares the same prompts: question 2 ran at batch 1 only, so it is left out
    sweep = [rec("vanilla", 1, 10, 9, 1.0), rec("vanilla", 2, 10, 9, 1.0), rec("vanilla", 1, 10, 9, 0.5, batch_n=2)]
    kept, which = report.every_batch_prompts(sweep)
    assert {(r["question_id"], r["batch_size"]) for r in kept} == {("1", 1), ("1", 2)} and "the 1 prompts" in which
    # no prompt at every batch size: everything is kept, and the description says the work differs
    kept, which = report.every_batch_prompts(sweep[1:2] + sweep[2:])
    assert len(kept) == 2 and "none ran at every batch size" in which
    # the overview leaves out eagle variants that only ran beside the default eagle, keeps the others
    mixed = [rec("vanilla", 1, 5, 4, 1.0), rec("eagle", 1, 5, 4, 1.0), rec("eagle:chain3", 1, 5, 4, 1.0),
             rec("hf", 1, 5, 4, 1.0), rec("vanilla", 2, 5, 4, 1.0, dataset="e"),
             rec("eagle:chain5", 2, 5, 4, 1.0, dataset="e")]
    assert report._overview_methods(mixed) == ["eagle", "hf", "eagle:chain5"]
    # the summary: one row per method, speedup and tau as above
    summary = report.summary_table(vanilla + eagle)
    assert "| d | 0 | 1 | vanilla | 2 | 22 | 11.0 | 1.00x | 1.00 |" in summary
    assert "| d | 0 | 1 | eagle | 2 | 22 | 22.0 | 2.00x | 2.00 |" in summary
    shares = report.time_shares([rec("eagle", 1, 11, 4, 2.0, prefill_s=0.2, draft_s=0.6, verify_s=1.0)])
    assert shares == pytest.approx({"prefill": 0.1, "draft": 0.3, "verify": 0.5})


def test_dispatcher_table_compares_pooled_predictions_with_measured_speedup():
    vanilla = [rec("vanilla", q, 11, 10, 1.0, [], draft_s=0.01, verify_s=0.09) for q in (1, 2)]
    # predicted: 2 rounds of 3 tokens in 0.02 s each against a 0.01 s plain step -> (6/0.04) / (2/0.02) = 1.5x
    pred = {"predicted_rounds": 2, "predicted_tokens": 6.0, "predicted_s": 0.04, "predicted_vanilla_s": 0.02,
            "tree_rounds": {"chain3": 2}, "draft_s": 0.1, "verify_s": 0.3}
    auto = [rec("eagle", q, 11, 4, 0.5, [4, 2], depth=3, **pred) for q in (1, 2)]
    # measured 2.0x on the same prompts; a record without its vanilla counterpart is left out
    lines = report.dispatch_table(vanilla + auto + [rec("eagle", 3, 11, 4, 0.01, **pred)])
    row = next(ln for ln in lines if "| eagle |" in ln)
    # ratio 0.75: outside 15%; tokens/round 3.00 vs tau 2.50; step 20 ms predicted vs (0.1 + 0.3) / 4 s measured
    assert row == ("| d | 0 | 1 | eagle | 2 | chain3 100% | 1.50x | 2.00x | 0.75 | **no** | 3.00 / 2.50 | "
                   "20.00 / 100.00 | 10.00 / 10.00 |")
    assert report.dispatch_table(vanilla) == []  # no dispatcher records, no table


def test_cost_curve_math():
    curve = [{"batch_size": 1, "n_tokens": n, "relative": r, "median_s": 0.01 * r}
             for n, r in ((1, 1.0), (2, 1.1), (4, 1.3), (8, 2.1))]
    assert report.relative_cost(curve, 1, 4) == pytest.approx(1.3)
    assert report.relative_cost(curve, 1, 6) == pytest.approx(1.7)  # interpolated
    assert report.relative_cost(curve, 1, 16) == pytest.approx(3.7)  # extrapolated along the last segment
    assert report.speedup_bound(3.0, 1.5, 0.5) == pytest.approx(1.5)
    assert report.chain_tau(0.5, 3) == pytest.approx(1.75)
    best = report.suggest_dispatcher(curve, [{"label": "small", "nodes": 2, "tau": 1.5, "draft_ratio": 0.1},
                                             {"label": "big", "nodes": 8, "tau": 2.5, "draft_ratio": 0.2}])
    assert best[1]["label"] == "small" and best[1]["bound"] == pytest.approx(1.25)  # 1.5/1.2 > 2.5/2.3


def test_cost_curve_times_its_token_counts_in_rounds(monkeypatch):
    """Every round times one forward of each N, so a slow stretch of a shared machine spreads over all N; the
    medians come from the timed rounds only (warm-up rounds left out), relative to the smallest N."""
    from helpers import tiny_target

    target, _ = tiny_target("llama")
    model = target.model
    calls = []
    clock = iter(range(10_000))  # perf_counter: +1 per read, so a forward of N reads N apart (see forward)

    class Counted:
        def __getattr__(self, name):
            return getattr(model, name)

        def __call__(self, tokens, positions, cache, **kw):
            if not kw.get("prefill"):
                calls.append((tokens.shape[0], tokens.shape[1]))
                for _ in range(tokens.shape[1] - 1):
                    next(clock)  # this forward "takes" N ticks
            return model(tokens, positions, cache, **kw)

    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(clock)))
    points = bench.cost_curve(type("T", (), {"model": Counted()})(), n_tokens=(4, 1, 2), batch_sizes=(1, 2),
                              prefix=8, repeats=3, warmup=1)
    per_batch = [(b, n) for _ in range(4) for n in (1, 2, 4) for b in (1,)] + \
                [(b, n) for _ in range(4) for n in (1, 2, 4) for b in (2,)]
    assert calls == per_batch  # rounds of 1, 2, 4 (sorted), warm-up round included
    assert [(p["batch_size"], p["n_tokens"], p["median_s"], p["relative"], p["repeats"]) for p in points] == [
        (b, n, float(n), float(n), 3) for b in (1, 2) for n in (1, 2, 4)]


@pytest.mark.parametrize("kwargs,named", [
    ({"n_tokens": ()}, "--cost-tokens"), ({"n_tokens": (0, 2)}, "--cost-tokens"),
    ({"batch_sizes": ()}, "--cost-batch-sizes"), ({"repeats": 0}, "--cost-repeats"),
    ({"prefix": 0}, "--cost-prefix"),
])
def test_cost_curve_refuses_empty_or_non_positive_settings(kwargs, named):
    with pytest.raises(ValueError, match=named):
        bench.cost_curve(None, **kwargs)  # refused before the target is touched


def test_bench_names_a_flag_that_is_not_a_list_of_integers(model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--model", str(model_dir), "--out", str(tmp_path), "--cost-curve", "--cost-tokens", "1,x"])
    assert exit_.value.code == 2
    assert "--cost-tokens must be a comma-separated list of integers, got '1,x'" in capsys.readouterr().err


def test_mismatch_detection_recomputes_from_tokens():
    vanilla = [rec("vanilla", 1, 5, 4, 1.0)]
    same = rec("eagle", 1, 5, 2, 0.5)
    other = rec("eagle:chain2", 1, 5, 2, 0.5, token_ids=[0, 1, 9, 3, 4], mismatch=False)
    sampled = rec("eagle:x", 1, 5, 2, 0.5, token_ids=[7], temperature=1.0)
    found = report.find_mismatches(vanilla + [same, other, sampled])
    assert [(r["method"], i) for r, i in found] == [("eagle:chain2", 2)]
    assert bench.first_mismatch([1, 2], [1, 2, 3]) == 2 and bench.first_mismatch([1], [1]) is None


# ============================================================================================ parsing
def test_method_strings():
    names = bench.split_methods("vanilla,eagle:dynamic,depth=6,topk=8,tokens=32,hf,replay:3,eagle:head=/h,chain3")
    assert names == ["vanilla", "eagle:dynamic,depth=6,topk=8,tokens=32", "hf", "replay:3", "eagle:head=/h,chain3"]
    m = bench.parse_method(names[1])
    assert (m.kind, m.draft.tree, m.draft.depth, m.draft.topk, m.draft.tree_tokens) == ("eagle", "dynamic", 6, 8, 32)
    m = bench.parse_method("eagle:head=/h,chain3,align=last")
    assert (m.draft.draft, m.draft.tree, m.draft.depth, m.draft.alignment) == ("/h", "chain", 3, "last")
    assert bench.parse_method("eagle").draft.tree == "auto" and bench.parse_method("eagle").draft.max_lag == 1024
    m = bench.parse_method("eagle:none,lag=0")  # the paused state's old cost: each pair encoded at its step
    assert (m.draft.tree, m.draft.max_lag) == ("none", 0)
    assert bench.parse_method("hf-prompt-lookup").k == 10 and bench.parse_method("replay:5").k == 5
    assert bench.parse_method("eagle:chain1").draft.draft_temperature is None  # each request's own
    assert bench.parse_method("eagle:chain1,dtemp=request").draft.draft_temperature is None
    assert bench.parse_method("eagle:chain1,dtemp=0.5").draft.draft_temperature == 0.5
    for bad in ("-1", "nan", "hot"):
        with pytest.raises(bench.BenchError, match="dtemp"):
            bench.parse_method(f"eagle:chain1,dtemp={bad}")
    assert bench.parse_method("eagle").draft.cost_feedback is True
    assert bench.parse_method("eagle:auto,feedback=off").draft.cost_feedback is False
    with pytest.raises(bench.BenchError, match="feedback=on|off"):
        bench.parse_method("eagle:auto,feedback=maybe")
    methods = bench.parse_methods(["hf,replay:2", "vanilla"])
    assert [x.name for x in methods] == ["vanilla", "hf", "replay:2"]  # vanilla first
    for bad in ("foo", "eagle:bogus", "eagle:depth=3", "replay:0", "eagle:lag=-1", "eagle:lag=x"):
        with pytest.raises(bench.BenchError):
            bench.parse_methods([f"vanilla,{bad}"])
    with pytest.raises(bench.BenchError, match="add vanilla"):
        bench.parse_methods(["replay:3"])


def test_dataset_formats(tmp_path):
    (tmp_path / "mt").mkdir()
    (tmp_path / "mt" / "question.jsonl").write_text(
        json.dumps({"question_id": 81, "category": "writing", "turns": ["a?", "b?"]}) + "\n"
        + json.dumps({"question_id": 82, "category": "math", "turns": ["c?", "d?"]}) + "\n")
    with gzip.open(tmp_path / "HumanEval.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
    (tmp_path / "alpaca.json").write_text(json.dumps([{"instruction": "Say", "input": "hi", "output": "x"},
                                                      {"instruction": "Go", "input": "", "output": "y"}]))
    (tmp_path / "alpaca_eval.json").write_text(json.dumps([{"dataset": "koala", "instruction": "Why?"}]))
    mt = load_questions(str(tmp_path / "mt" / "question.jsonl"))
    assert [(q.question_id, q.category, q.turns) for q in mt] == [("81", "writing", ("a?", "b?")),
                                                                   ("82", "math", ("c?", "d?"))]
    assert mt[0].dataset == "mt"  # the folder names a generic "question.jsonl"
    mt_path = str(tmp_path / "mt" / "question.jsonl")
    assert [q.question_id for q in load_questions(mt_path, categories=["math"])] == ["82"]
    assert load_questions(mt_path, max_turns=1)[0].turns == ("a?",)
    assert [q.question_id for q in load_questions(mt_path, per_category=1, limit=1)] == ["81"]
    he = load_questions(str(tmp_path / "HumanEval.jsonl.gz"))[0]
    assert (he.dataset, he.question_id, he.turns) == ("HumanEval", "HumanEval/0", ("def f():\n",))
    assert load_questions(f"gsm8k={tmp_path / 'test.jsonl'}")[0].dataset == "gsm8k"
    assert [q.turns[0] for q in load_questions(str(tmp_path / "alpaca.json"))] == ["Say\n\nhi", "Go"]
    assert load_questions(str(tmp_path / "alpaca_eval.json"))[0].category == "koala"
    with pytest.raises(DatasetError, match="no category"):
        load_questions(str(tmp_path / "mt" / "question.jsonl"), categories=["nope"])
    (tmp_path / "bad.jsonl").write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(DatasetError, match="record 0"):
        load_questions(str(tmp_path / "bad.jsonl"))


def test_second_turn_carries_the_first_answer():
    tok = tiny_tokenizer()
    one = tok.decode(encode_conversation(tok, ["hello"], []))
    two = tok.decode(encode_conversation(tok, ["hello", "again"], ["the answer"]))
    assert one.count("<|im_start|>user") == 1
    assert two.startswith(one) and "the answer<|im_end|>" in two and two.count("<|im_start|>user") == 2
    assert two.endswith("<|im_start|>assistant\n")


# ============================================================================================ tiny-model runs
@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "mt.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in [
        {"question_id": 1, "category": "writing", "turns": ["The quick brown fox", "1 2 3 4"]},
        {"question_id": 2, "category": "coding", "turns": ["def add(a, b):", "Speculative decoding"]},
        {"question_id": 3, "category": "coding", "turns": ["Café, naïve"]}]))
    return path


def bench_argv(model_dir, questions, out, *extra):
    return ["bench", "--model", str(model_dir), "--dataset", str(questions), "--out", str(out),
            "--max-new-tokens", "8", "--threads", "1", *extra]


@pytest.fixture(scope="module")
def bench_run(model_dir, head_dir, questions, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    methods = f"vanilla,eagle:head={head_dir},chain3,replay:3,hf,llama.cpp,eagle"
    assert main(bench_argv(model_dir, questions, out, "--methods", methods, "--batch-size", "1,2")) == 0
    return out


def test_bench_writes_records_report_and_plots(bench_run, head_dir):
    records = bench.read_records(bench_run / "records.jsonl")
    eagle = f"eagle:head={head_dir},chain3"
    # 5 prompts (3 first turns + 2 second turns) x 4 runnable methods x 2 batch sizes
    assert len(records) == 5 * 4 * 2
    assert {r["method"] for r in records} == {"vanilla", eagle, "replay:3", "hf"}
    for r in records:
        assert set(bench.KEY_FIELDS) <= set(r) and r["machine"]["torch_threads"] == 1
        assert r["new_tokens"] == len(r["token_ids"]) <= 8 and r["batch_wall_s"] > 0
        assert r["mismatch"] is (None if r["method"] == "vanilla" else False)
    # groups run the methods in alternating order (replay last: it replays vanilla); written in run order
    b1t1 = [(r["question_id"], r["method"]) for r in records if r["batch_size"] == 1 and r["turn"] == 1]
    assert [m for q, m in b1t1 if q == "1"] == ["vanilla", eagle, "hf", "replay:3"]
    assert [m for q, m in b1t1 if q == "2"] == ["hf", eagle, "vanilla", "replay:3"]
    assert all(r["measured_speedup"] is not None for r in records if r["method"] != "vanilla")
    by = {(r["question_id"], r["turn"], r["method"], r["batch_size"]): r for r in records}
    # every method got the same turn-2 prompt: both turns, with vanilla's first answer in between
    tok = tiny_tokenizer()
    first = by[("1", 1, "vanilla", 1)]["token_ids"]
    answer = tok.decode(first[: first.index(2)] if 2 in first else first, skip_special_tokens=True).strip()
    expected = encode_conversation(tok, ["The quick brown fox", "1 2 3 4"], [answer])
    assert {by[("1", 2, m, 1)]["prompt_tokens"] for m in ("vanilla", eagle, "hf")} == {len(expected)}
    # replay drafts vanilla's own tokens: everything it proposes is accepted
    replay = [r for r in records if r["method"] == "replay:3"]
    assert report.acceptance_by_position(replay) == pytest.approx([1.0, 1.0, 1.0])
    run = json.loads((bench_run / "run.json").read_text())
    # the llama.cpp arm is refused either way here: not installed, or installed but the model is not the default GGUF
    why = run["skipped"]["llama.cpp"]
    assert ("llama.cpp is not installed" in why or "default GGUF only" in why) and "no draft head" in run["skipped"]["eagle"]
    text = (bench_run / "report.md").read_text()
    assert "### mt: T=0, batch size 1" in text and "| replay:3 | chain3 |" in text and "by category" in text
    assert "skipped `llama.cpp`" in text and "no mismatch" in text
    assert "## Summary" in text and "| mt | 0 | 1 | hf | 5 |" in text and "![Overview" in text
    for png in ("overview.png", "speedup_mt_T0.png", "acceptance_T0.png", "batch_scaling_T0.png",
                "tau_vs_tree_T0.png"):
        assert (bench_run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def test_resume_skips_recorded_work(bench_run, model_dir, head_dir, questions, monkeypatch):
    from eaglespec.engine.generate import Engine

    calls = []
    real = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, reqs: calls.append(len(reqs)) or real(self, reqs))
    path = bench_run / "records.jsonl"
    lines = path.read_text().splitlines()
    argv = bench_argv(model_dir, questions, bench_run, "--batch-size", "1,2", "--no-report", "--methods",
                      f"vanilla,eagle:head={head_dir},chain3,replay:3,hf,llama.cpp,eagle")
    with pytest.raises(SystemExit):  # an existing run is never appended to by accident
        main(argv)
    assert main(argv + ["--resume"]) == 0
    assert calls == [] and path.read_text().splitlines() == lines
    # an interrupted run: the replay records of one group are missing and the last line is cut short
    lost = [x for x in lines if '"replay:3"' in x and '"batch_size": 2' in x and '"turn": 2' in x]
    assert len(lost) == 2
    kept = [x for x in lines[:-1] if x not in lost]
    path.write_text("\n".join(kept) + "\n" + lines[-1][:40])
    assert main(argv + ["--resume"]) == 0
    redone = bench.read_records(path)
    assert sorted(map(bench.record_key, redone)) == sorted(bench.record_key(json.loads(x)) for x in lines)
    assert calls == [2, 2]  # the replay engine: its warm-up, then the one lost group (the cut line is hf's)
    with pytest.raises(SystemExit):  # resuming with other settings is refused
        main(argv + ["--resume", "--max-new-tokens", "9"])


def test_report_flags_an_injected_mismatch(bench_run, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(bench_run, out)
    records = bench.read_records(out / "records.jsonl")
    bad = dict(next(r for r in records if r["method"] == "hf" and r["batch_size"] == 1))
    bad["token_ids"] = bad["token_ids"][:3] + [(bad["token_ids"][3] + 1) % 50] + bad["token_ids"][4:]
    bad["method"] = "hf-prompt-lookup"
    with (out / "records.jsonl").open("a") as f:
        f.write(json.dumps(bad) + "\n")
    assert main(["report", str(out), "--no-plots"]) == 0
    text = (out / "report.md").read_text()
    assert "GREEDY MISMATCHES: 1 record(s)" in text and "hf-prompt-lookup batch 1: first difference at token 3" in text
    assert "| hf-prompt-lookup | none | 1 |" in text and "**1 of 1**" in text


def test_bench_records_the_dispatchers_choice_and_both_speedups(model_dir, head_dir, questions, tmp_path):
    out = tmp_path / "auto"
    with quick_calibration(tmp_path / "cache"):
        assert main(bench_argv(model_dir, questions, out, "--methods", f"vanilla,eagle:head={head_dir},auto",
                               "--batch-size", "1,2", "--max-turns", "1", "--no-report")) == 0
    records = bench.read_records(out / "records.jsonl")
    vanilla = {(r["question_id"], r["batch_size"]): r for r in records if r["method"] == "vanilla"}
    auto = [r for r in records if r["method"] != "vanilla"]
    assert len(auto) == 6 and all(r["measured_speedup"] is None for r in vanilla.values())
    for r in auto:
        assert r["tree"] == "auto" and r["mismatch"] is False
        assert sum(r["tree_rounds"].values()) == r["target_forwards"] == r["predicted_rounds"]
        assert r["predicted_speedup"] > 0 and 1 <= r["tree_nodes"] <= 17
        fb = r["cost_feedback"]  # the step-cost feedback's state after the group: timed steps of its batch size
        assert fb and all(e["batch"] in (1, 2) and e["weight"] > 0 and e["factor"] >= 1 for e in fb)
        assert all(e["context"] is not None for e in fb)  # priced at the rows' context, banded
        v = vanilla[(r["question_id"], r["batch_size"])]
        tps = (lambda x: x["new_tokens"] * x["batch_n"] / x["batch_wall_s"])
        assert r["measured_speedup"] == pytest.approx(tps(r) / tps(v), abs=1e-4)
    report.write_report(out, plots=False)
    text = (out / "report.md").read_text()
    assert "## Dispatcher: predicted vs measured" in text
    for b in (1, 2):
        rs = [r for r in auto if r["batch_size"] == b]
        pred = SequenceStats.pooled(SequenceStats.from_record(r) for r in rs).predicted_speedup
        meas = report.speedup(rs, [vanilla[(r["question_id"], b)] for r in rs])
        assert f"| mt | 0 | {b} | eagle:head={head_dir},auto | 3 |" in text
        assert f"| {pred:.2f}x | {meas:.2f}x | {pred / meas:.2f} |" in text


def test_cost_curve_smoke(model_dir, tmp_path, capsys):
    out = tmp_path / "cost"
    assert main(["bench", "--model", str(model_dir), "--out", str(out), "--cost-curve", "--cost-tokens", "1,2,4",
                 "--cost-batch-sizes", "1,2", "--cost-prefix", "16", "--cost-repeats", "2", "--tau", "2"]) == 0
    curve = report.read_cost_curve(out)
    assert [(c["batch_size"], c["n_tokens"]) for c in curve] == [(b, n) for b in (1, 2) for n in (1, 2, 4)]
    assert all(c["relative"] == 1.0 for c in curve if c["n_tokens"] == 1)
    assert all(c["median_s"] > 0 and c["prefix"] == 16 and "machine" in c for c in curve)
    printed = capsys.readouterr().out
    assert "suggested dispatcher table" in printed and "ASSUMED chain model" in printed and "tau 2.00" in printed
    assert (out / "cost_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Cost curve" in (out / "report.md").read_text()


# ============================================================================================ diagnostics
def test_teacher_forced_unroll_reproduces_real_drafting(model_dir, head_dir):
    """Fed the tokens the head itself drafts, the teacher-forced unroll must make the same predictions as the
    proposer's real chain drafting (same cache contents, positions and masks): top-1 agreement 1 at every step."""
    from eaglespec.config import GenerationConfig
    from eaglespec.measure.diagnose import StepStats, teacher_forced_unroll
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.runtime.loading import load_target
    from eaglespec.spec.speculative import DraftOptions, build_proposer

    target = load_target(str(model_dir))
    steps = 3
    proposer = build_proposer(target, DraftOptions(draft=str(head_dir), tree="chain", depth=steps))
    assert not any(p.requires_grad for p in proposer.head.parameters())  # loaded for decoding: frozen
    prompt = target.tokenizer.encode("The quick brown fox jumps")
    trees = []
    real_propose = proposer.propose

    def propose(rows, pending, prefix, **kw):
        trees.append(real_propose(rows, pending, prefix, **kw))
        return trees[-1]

    proposer.propose = propose
    with torch.inference_mode():
        Engine(target, proposer).generate([Request(prompt, GenerationConfig(2))])
        chain = trees[0].tokens[0].tolist()  # the first round, right after the prefill: [pending, d1, d2, d3]
        stats = [StepStats() for _ in range(steps)]
        teacher_forced_unroll(target, proposer.head, prompt + chain, len(prompt), steps, stats)
    assert [s.n for s in stats] == [1] * steps
    assert [s.top1 for s in stats] == [1] * steps
    assert stats[0].cos_teacher == pytest.approx(1.0, abs=1e-5)


def test_diagnose_cli(model_dir, head_dir, questions, tmp_path, capsys):
    out = tmp_path / "diag.json"
    assert main(["diagnose", "--model", str(model_dir), "--draft", str(head_dir), "--dataset", str(questions),
                 "--limit", "2", "--steps", "3", "--max-new-tokens", "16", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["prompts"] == 2 and len(d["steps"]) == 3 and len(d["acceptance_by_position"]) == 3
    assert set(d["tau_by_category"]) == {"writing", "coding"} and d["verdict"]
    assert all(-1 <= s["cos_target"] <= 1 and 0 <= s["top1"] <= 1 for s in d["steps"])
    assert "verdict:" in printed and "retrain" in printed  # a random head must be told to retrain


def test_peer_arms_parse_and_are_skipped_with_the_install_command(model_dir, questions, tmp_path, monkeypatch):
    ms = {m.name: m for m in bench.parse_methods(["vllm,vllm-eagle,vllm-eagle:1,llama.cpp-eagle:2"])}
    assert (ms["vllm-eagle"].kind, ms["vllm-eagle"].k) == ("vllm-eagle", bench.PEER_DRAFT_TOKENS)
    assert ms["vllm-eagle:1"].k == 1 and ms["llama.cpp-eagle:2"].k == 2
    assert ms["vllm"].exact and ms["vllm-eagle"].exact  # same float32 weights, lossless: checked against vanilla
    assert not ms["llama.cpp-eagle:2"].exact  # its target is the quantized GGUF
    for bad in ("vllm:2", "vllm-eagle:0", "llama.cpp-eagle:x"):
        with pytest.raises(bench.BenchError):
            bench.parse_methods([bad])
    monkeypatch.setenv("EAGLESPEC_INTEROP_VENVS", str(tmp_path / "no-venvs"))
    out = tmp_path / "b"
    assert main(bench_argv(model_dir, questions, out, "--methods", "vanilla,vllm,vllm-eagle,llama.cpp-eagle",
                           "--max-turns", "1", "--no-report")) == 0
    assert {r["method"] for r in bench.read_records(out / "records.jsonl")} == {"vanilla"}
    skipped = json.loads((out / "run.json").read_text())["skipped"]
    assert set(skipped) == {"vllm", "vllm-eagle", "llama.cpp-eagle"}
    assert all("is not installed" in why and "scripts/interop.sh --setup" in why for why in skipped.values())


def test_an_empty_question_selection_is_refused_by_name(questions, tmp_path):
    """--limit 0 is a clear error before any model loads, not an IndexError (an unknown category is refused by
    the dataset reader, naming the categories there)."""
    for flags, match in ((["--limit", "0"], "--limit must be >= 1"),
                         (["--limit-per-category", "0"], "--limit-per-category must be >= 1")):
        with pytest.raises(bench.BenchError, match=match):
            bench.Bench(bench.BenchConfig(datasets=[str(questions)], out=str(tmp_path / "o"), methods=["vanilla"],
                                          **{"limit": None, "limit_per_category": None, "categories": None,
                                             **_flag_dict(flags)}))


def _flag_dict(flags: list[str]) -> dict:
    name, value = flags[0].lstrip("-").replace("-", "_"), flags[1]
    return {name: [value] if name == "categories" else int(value)}


def test_a_compiled_warm_up_runs_a_verification_even_when_the_dispatcher_pauses():
    """With a compiled target a several-token verification is a graph of its own, compiled on first use: the
    warm-up must run one even when the adaptive dispatcher pauses throughout it (it did not, and a compiled
    bench compiled that graph inside its first timed request). The dispatcher is put back afterwards."""
    from helpers import tiny_target
    from test_costmodel import flat_costs
    from test_speculative import make_head

    from eaglespec.config import GenerationConfig
    from eaglespec.spec.dispatch import AdaptiveDispatcher
    from eaglespec.spec.proposer import EagleProposer

    target, _ = tiny_target("llama")
    tokens = []

    class Recorder:  # stands in for the compiled graph: sees every decode and verification forward
        def handles(self, n_new, block_mask, logits_at):
            return True

        def __call__(self, toks, positions, cache, **kw):
            tokens.append(toks.shape[1])
            return target.model(toks, positions, cache, eager=True, **kw)

    prompt, cfg = tiny_tokenizer().encode("warm up"), GenerationConfig(8, ignore_eos=True)
    try:
        for graph in (None, Recorder()):
            target.model.step_graph = graph
            # nothing pays: paused throughout (prices as calibrated: the tiny model costs nothing like them)
            d = AdaptiveDispatcher(flat_costs(per_token=0.01, batches=(1, 2)), cost_feedback=False)
            proposer = EagleProposer(make_head(target, "eagle3"), d)
            runner = bench.EngineRunner(target, proposer, 1)
            with torch.inference_mode():
                runner.warm_up([prompt], [cfg])
                assert proposer.dispatcher is d
                if graph is not None:
                    assert tokens.count(1) >= 7 and max(tokens) == 2  # paused steps, then chain 1's verifications
                    tokens.clear()
                    runner.run([prompt], [cfg])
                    assert set(tokens) == {1}  # the timed runs pause as before
    finally:
        target.model.step_graph = None


def test_interleaved_bench_steps_the_engines_in_turns(model_dir, head_dir, questions, tmp_path, monkeypatch):
    """--interleave: vanilla and the eagle method decode each group in lockstep, one engine step of each in
    turn; each method's group wall is the sum of its own steps, so its last request's wall equals it; the replay
    drafter and hf still run alone, after vanilla's answers exist; greedy output is unchanged; a resumed run
    keeps the protocol it started with."""
    from eaglespec.engine.generate import Engine

    calls: list[list[int]] = []  # per lockstep run, the engines that stepped, in order
    active = [False]
    real_step, real_run = Engine.step, bench.run_interleaved
    monkeypatch.setattr(Engine, "step", lambda self, *a, **k: active[0] and calls[-1].append(id(self)) or
                        real_step(self, *a, **k))

    def lockstep(*a, **k):
        calls.append([])
        active[0] = True
        try:
            return real_run(*a, **k)
        finally:
            active[0] = False  # later steps (warm-ups, the replay drafter) are not this run's

    monkeypatch.setattr(bench, "run_interleaved", lockstep)
    out = tmp_path / "interleaved"
    eagle = f"eagle:head={head_dir},chain3"
    argv = bench_argv(model_dir, questions, out, "--methods", f"vanilla,{eagle},replay:3,hf", "--batch-size", "1,2",
                      "--max-turns", "1", "--no-report", "--temperature", "0,1", "--interleave")
    assert main(argv) == 0
    records = bench.read_records(out / "records.jsonl")
    assert len(records) == 3 * 4 * 2 * 2 and json.loads((out / "run.json").read_text())["settings"]["interleave"]
    for r in records:
        if r["temperature"] == 0 and r["method"] != "vanilla":
            assert r["mismatch"] is False
        assert 0 < r["wall_s"] <= r["batch_wall_s"]
    groups: dict = {}
    for r in records:
        if r["method"] in ("vanilla", eagle):
            groups.setdefault((r["method"], r["batch_size"], r["temperature"], r["batch_wall_s"]), []).append(r)
    # batch 1: a group per prompt; batch 2: prompts 1-2, then 3
    assert sorted(len(g) for g in groups.values()) == [1] * 16 + [2] * 4
    for g in groups.values():  # the wall of the group's last request is the sum of all its engine's steps
        assert max(r["wall_s"] for r in g) == g[0]["batch_wall_s"]
    # each lockstep run stepped its two engines in turns until the one with fewer steps was done
    assert len(calls) == len(groups) // 2
    for run in calls:
        first, second = run[0], next(e for e in run if e != run[0])
        k = min(run.count(first), run.count(second))
        assert list(run[: 2 * k]) == [first, second] * k and len(set(run[2 * k:])) <= 1
    replay = [r for r in records if r["method"] == "replay:3" and r["temperature"] == 0]
    assert report.acceptance_by_position(replay) == pytest.approx([1.0, 1.0, 1.0])  # it replayed vanilla's answers
    with pytest.raises(SystemExit):  # resuming without --interleave is refused (the protocol changed)
        main([a for a in argv if a != "--interleave"] + ["--resume"])
