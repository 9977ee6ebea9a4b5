"""Evaluation questions for the benchmark and diagnostics: reading common prompt files, building chat prompts.

A dataset is a file given by path (nothing is copied into the repository). Every record becomes a
`Question(dataset, question_id, category, turns)`; the formats are recognized per record:

| record keys | format | turns |
|---|---|---|
| `turns` (list of str) | MT-bench, Spec-Bench, EAGLE eval sets | all turns (multi-turn) |
| `conversations` [{from, value}] | ShareGPT | the `human` messages |
| `prompt` | HumanEval (`task_id`), plain prompt files | one |
| `question` | GSM8K | one |
| `instruction` (+ `input`) | Alpaca, AlpacaEval (`dataset` = category) | one: instruction, blank line, input |

Files: `.jsonl` (one object per line), `.json` (a list of objects) and either gzipped (`.gz`). The question
id is `question_id`, `task_id` or `id`, else the record's index in the file; the category is `category`,
else AlpacaEval's `dataset`, else "".

Multi-turn prompts: turn k is asked after the answers of turns 1..k-1 (the model's own answers), rendered
through the tokenizer's chat template as a user/assistant history (`encode_conversation`).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DatasetError", "Question", "dataset_name", "encode_conversation", "load_questions", "read_json_list_prefix",
           "read_records"]

GENERIC_STEMS = {"question", "questions", "test", "train", "data", "dev", "eval", "validation"}


class DatasetError(ValueError):
    """A dataset file is missing, unreadable, or has records of no known format."""


@dataclass(frozen=True)
class Question:
    dataset: str
    question_id: str  # as text, so ids from every format compare and serialize alike
    category: str
    turns: tuple[str, ...]


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def dataset_name(spec: str) -> tuple[str, Path]:
    """`NAME=PATH` or `PATH` -> (name, path). Default name: the file's stem, or its folder's name when the
    stem says nothing (`mt_bench/question.jsonl` -> "mt_bench", `HumanEval.jsonl.gz` -> "HumanEval")."""
    name, sep, rest = spec.partition("=")
    if sep and name and "/" not in name and not Path(spec).exists():
        return name, Path(rest).expanduser()
    path = Path(spec).expanduser()
    stem = _stem(path)
    if stem.lower() in GENERIC_STEMS and path.parent.name:
        return path.parent.name, path
    return stem, path


def read_records(path: str | Path) -> list[dict]:
    """All records of a JSON list or JSON Lines file (``.gz`` allowed), each a JSON object.

    The one reader of data files: benchmarks, prompt files and training data all come through it.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot read it ({e})") from None
    if text.lstrip().startswith("["):  # a JSON list; anything else is read as JSON lines
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        records = data
    else:
        records = []
        # Lines end at "\n" only (JSON Lines): str.splitlines() would also split inside a record at the
        # U+2028 / U+2029 / U+0085 separators that valid JSON may hold raw (ShareGPT text does).
        for lineno, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise DatasetError(f"{path}: record {i} is a {type(rec).__name__}, expected a JSON object")
    return records


def read_json_list_prefix(text: str, where: str = "data") -> tuple[list, int]:
    """The complete elements of a JSON list that may be cut off mid-element, and how many characters of the
    cut-off tail were dropped (0 for a complete list).

    For files that ship truncated (e.g. a size-capped package of a large list): every element that parses
    completely is kept; the partial one at the cut is dropped and reported, never half-read.
    """
    decoder = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        raise DatasetError(f"{where}: not a JSON list (it does not start with '[')")
    i += 1
    out: list = []
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            return out, 0  # cut right after an element or a comma: nothing partial to drop
        if text[i] == "]":
            return out, 0
        if out:
            if text[i] != ",":
                raise DatasetError(f"{where}: malformed JSON list at character {i} (expected ',' or ']')")
            i += 1
            while i < n and text[i] in " \t\r\n":
                i += 1
        try:
            value, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            if not out:
                raise DatasetError(f"{where}: the first element of the JSON list does not parse") from None
            return out, n - i  # the partial element at the cut
        if end == n and isinstance(value, (int, float)) and not isinstance(value, bool):
            return out, n - i  # a number at the very end may itself be cut (3334 -> 333)
        out.append(value)
        i = end


def _turns(rec: dict) -> list[str] | None:
    """The user turns of one record, or None when its format is unknown."""
    turns = rec.get("turns")
    if isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns):
        return turns
    conv = rec.get("conversations")
    if isinstance(conv, list):
        human = [m.get("value", "") for m in conv if isinstance(m, dict) and m.get("from") in ("human", "user")]
        return [h for h in human if isinstance(h, str) and h.strip()]  # none: the record is skipped
    for key in ("prompt", "question"):
        if isinstance(rec.get(key), str):
            return [rec[key]]
    if isinstance(rec.get("instruction"), str):
        extra = rec.get("input")
        return [rec["instruction"] + (f"\n\n{extra}" if isinstance(extra, str) and extra.strip() else "")]
    return None


def load_questions(spec: str, limit: int | None = None, categories: Sequence[str] | None = None,
                   max_turns: int | None = None, per_category: int | None = None) -> list[Question]:
    """Questions of one dataset file (`NAME=PATH` or `PATH`): filtered by category, then the first
    `per_category` of each category, then the first `limit` in file order."""
    name, path = dataset_name(spec)
    records = read_records(path)
    questions = []
    for i, rec in enumerate(records):
        turns = _turns(rec)
        if turns is None:
            raise DatasetError(f"{path}: record {i} has none of turns / conversations / prompt / question / "
                               f"instruction (keys: {sorted(rec)[:8]})")
        if not turns:
            continue
        qid = next((rec[k] for k in ("question_id", "task_id", "id") if rec.get(k) is not None), f"#{i}")
        category = rec.get("category") or rec.get("dataset") or ""
        questions.append(Question(name, str(qid), str(category), tuple(turns[:max_turns] if max_turns else turns)))
    if not questions:
        raise DatasetError(f"{path}: no questions in the file")
    if categories:
        known = sorted({q.category for q in questions})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise DatasetError(f"{path}: no category {unknown} (categories here: {known})")
        questions = [q for q in questions if q.category in set(categories)]
    if per_category is not None:
        count: Counter[str] = Counter()
        kept = []
        for q in questions:
            count[q.category] += 1
            if count[q.category] <= per_category:
                kept.append(q)
        questions = kept
    ids = [q.question_id for q in questions]
    if len(set(ids)) != len(ids):
        raise DatasetError(f"{path}: question ids are not unique")
    return questions[:limit] if limit is not None else questions


def encode_messages(tokenizer, messages: Sequence[dict]) -> list[int]:
    """The one prompt encoder: `messages` ({"role", "content"} dicts) through the tokenizer's chat template,
    with the generation prompt added, as token ids (the template places the special tokens itself)."""
    rendered = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)


def encode_conversation(tokenizer, turns: Sequence[str], answers: Sequence[str], chat: bool = True) -> list[int]:
    """Token ids asking `turns[-1]` after the earlier turns and their `answers` (len(answers) == len(turns) - 1).

    chat: through the tokenizer's chat template (user/assistant messages, generation prompt added);
    otherwise the texts joined by blank lines (raw completion prompts).
    """
    if len(answers) != len(turns) - 1:
        raise ValueError(f"{len(turns)} turns need {len(turns) - 1} earlier answers, got {len(answers)}")
    if not turns[-1].strip():
        raise ValueError("empty prompt")
    if not chat:
        parts = [x for pair in zip(turns, [*answers, ""]) for x in pair if x]
        return tokenizer.encode("\n\n".join(parts))
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: use --raw to send prompts as plain text")
    messages = []
    for k, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if k < len(answers):
            messages.append({"role": "assistant", "content": answers[k]})
    return encode_messages(tokenizer, messages)
