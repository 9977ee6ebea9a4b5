"""`eaglespec generate` end to end on a tiny HF model directory: JSON fields, speculation flags, errors."""

import json

import pytest

from eaglespec.cli import main
from helpers import quick_calibration, tiny_tokenizer


def run_json(capsys, *argv):
    assert main(["generate", *argv, "--json", "--no-warmup"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


FIELDS = {"text", "token_ids", "new_tokens", "target_forwards", "wall_s", "tokens_per_s", "tau",
          "accepted_per_position", "draft_s", "verify_s", "finish_reason", "prompt_tokens"}


def test_generate_json_vanilla_and_speculative_agree(capsys, model_dir, head_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "turns": ["The quick brown fox", "second turn"]}) + "\n"
                       + json.dumps({"prompt": "def add(a, b):"}) + "\n")
    common = ["--model", str(model_dir), "--prompt", "1 2 3 4", "--prompts-file", str(prompts),
              "--max-new-tokens", "12", "--ignore-eos"]
    vanilla = run_json(capsys, *common, "--draft", "none", "--batch-size", "2")
    assert len(vanilla) == 3 and all(FIELDS <= set(r) for r in vanilla)
    assert [r["prompt"] for r in vanilla] == ["1 2 3 4", "The quick brown fox", "def add(a, b):"]
    for r in vanilla:
        assert r["new_tokens"] == len(r["token_ids"]) == 12 and r["target_forwards"] == 11
        assert r["tau"] == 1.0 and r["finish_reason"] == "length"
    for tree in (["--tree", "chain", "--depth", "3"], ["--tree", "dynamic", "--depth", "3", "--topk", "2",
                                                       "--tree-tokens", "5"], ["--tree", "static"]):
        spec = run_json(capsys, *common, "--draft", str(head_dir), *tree)
        assert [r["token_ids"] for r in spec] == [r["token_ids"] for r in vanilla]


def test_generate_json_reports_the_trees_and_the_predicted_speedup(capsys, model_dir, head_dir, tmp_path):
    common = ["--model", str(model_dir), "--prompt", "1 2 3 4", "--prompt", "The quick brown fox",
              "--max-new-tokens", "16", "--ignore-eos"]
    vanilla = run_json(capsys, *common, "--draft", "none")
    with quick_calibration(tmp_path):
        auto = run_json(capsys, *common, "--draft", str(head_dir))
        table = run_json(capsys, *common, "--draft", str(head_dir), "--no-calibrate")
        fixed = run_json(capsys, *common, "--draft", str(head_dir), "--no-cost-feedback")
    labels = {"none", "chain1", "chain2", "chain3", "chain4", "chain6", "dynamic5x4:16"}
    for v, a, t, f in zip(vanilla, auto, table, fixed):
        assert a["token_ids"] == t["token_ids"] == f["token_ids"] == v["token_ids"]
        assert f["predicted_rounds"] == f["target_forwards"]
        assert sum(a["tree_rounds"].values()) == a["target_forwards"] and set(a["tree_rounds"]) <= labels
        assert a["predicted_speedup"] > 0 and a["predicted_rounds"] == a["target_forwards"]
        assert t["tree_rounds"] == {"chain1": t["target_forwards"]} and t["predicted_speedup"] is None
        assert v["tree_rounds"] == {} and v["predicted_speedup"] is None


def test_calibrate_measures_once_prints_the_table_and_force_measures_again(capsys, model_dir, head_dir, tmp_path,
                                                                           monkeypatch):
    from eaglespec.engine import calibrate as cal

    argv = ["calibrate", "--model", str(model_dir), "--draft", str(head_dir)]
    with quick_calibration(tmp_path):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "measured now" in out and "break-even" in out
        assert all(f"| {tree}" in out for tree in ("chain1", "chain6", "dynamic5x4:16"))
        (cached,) = (tmp_path / "calibration").glob("*.json")
        measured = cached.read_text()
        real = cal.calibrate
        monkeypatch.setattr(cal, "calibrate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured")))
        assert main(argv) == 0  # the cached table, printed the same way
        again = capsys.readouterr().out
        assert "cached" in again and again.split("\n", 1)[1] == out.split("\n", 1)[1]
        # --tree auto uses the same calibration (a new measurement would raise)
        assert main(["generate", "--model", str(model_dir), "--draft", str(head_dir), "--prompt", "hi",
                     "--max-new-tokens", "4", "--no-warmup"]) == 0
        with pytest.raises(AssertionError, match="measured"):
            main(argv + ["--force"])
        monkeypatch.setattr(cal, "calibrate", real)
        assert main(argv + ["--force"]) == 0
        assert "measured now" in capsys.readouterr().out
        assert [p.name for p in (tmp_path / "calibration").glob("*.json")] == [cached.name]
        assert cached.read_text() != measured  # measured again (timings never repeat to the nanosecond)


def test_calibrate_without_a_head_is_a_clear_error(capsys, model_dir):
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--model", str(model_dir)])
    assert e.value.code == 2 and "no draft head" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--prompt", "   "], "empty prompt"),
    (["--prompt", "hi", "--max-new-tokens", "-3"], "max-new-tokens"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature must be finite and >= 0"),
    (["--prompt", "hi", "--temperature", "inf"], "temperature must be finite and >= 0"),
    (["--prompt", "hi", "--temperature", "nan"], "temperature must be a number"),
    (["--prompt", "hi", "--top-p", "1.5"], "top_p"),
    ([], "no prompts"),
    (["--prompts-file", "/nonexistent.jsonl"], "no such file"),
    (["--prompt", "hi", "--draft", "/nonexistent-head"], "no such directory"),
    (["--prompt", "hi", "--tree", "chain", "--topk", "3"], "topk"),
])
def test_bad_input_is_a_clear_error(capsys, model_dir, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", str(model_dir), "--no-warmup", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_prompts_file_names_the_line(capsys, model_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"foo": 1}\n')
    with pytest.raises(SystemExit):
        main(["generate", "--model", str(model_dir), "--prompts-file", str(bad)])
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and "record 1" in err


def test_unsupported_architecture_is_refused(capsys, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=320)).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(SystemExit):
        main(["generate", "--model", str(tmp_path), "--prompt", "hi", "--no-warmup"])
    err = capsys.readouterr().err
    assert "gpt2" in err.lower() and "llama" in err.lower()


def test_the_parser_needs_no_server_packages():
    """Only `serve` needs FastAPI / pydantic / uvicorn: building the parser (every other command) imports none."""
    import subprocess
    import sys

    code = ("import sys; from eaglespec.cli import build_parser; build_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'pydantic', 'uvicorn', 'starlette'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_draft_temperature_flag_takes_request_or_a_number_and_refuses_the_rest(capsys):
    import argparse

    from eaglespec.flags import add_draft_args, draft_options

    p = argparse.ArgumentParser()
    add_draft_args(p)
    p.add_argument("--seed", type=int, default=None)
    assert draft_options(p.parse_args([])).draft_temperature is None  # default: each request's own
    assert draft_options(p.parse_args(["--draft-temperature", "request"])).draft_temperature is None
    assert draft_options(p.parse_args(["--draft-temperature", "0.7"])).draft_temperature == 0.7
    assert draft_options(p.parse_args(["--draft-temperature", "0"])).draft_temperature == 0.0
    for bad in ("-0.5", "nan", "warm"):
        with pytest.raises(SystemExit):
            p.parse_args(["--draft-temperature", bad])
        assert "--draft-temperature" in capsys.readouterr().err


def test_no_cost_feedback_reaches_the_dispatcher(monkeypatch):
    """`--no-cost-feedback` turns the dispatcher's price check off (it is on by default)."""
    import argparse

    from eaglespec.engine import calibrate as cal
    from eaglespec.flags import add_draft_args, draft_options
    from eaglespec.spec.costmodel import CostTable

    p = argparse.ArgumentParser()
    add_draft_args(p)
    p.add_argument("--seed", type=int, default=None)
    monkeypatch.setattr(cal, "calibration_for", lambda *a, **k: (CostTable({(1, 1): 0.01}, {}), False))
    for argv, on in (([], True), (["--no-cost-feedback"], False)):
        opts = draft_options(p.parse_args(argv))
        assert opts.cost_feedback is on
        assert (cal.adaptive_dispatcher(None, None, None, opts).feedback is not None) is on
