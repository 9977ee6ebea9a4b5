"""The raw records of `eaglespec bench`: file names, reading a records.jsonl, token comparison.

Shared by the benchmark (writes them) and the report (reads them), so neither imports the other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("eaglespec")

RECORDS_FILE = "records.jsonl"
RUN_FILE = "run.json"
COST_FILE = "cost_curve.jsonl"


class BenchError(ValueError):
    """A bad benchmark request (unknown method, resume with other settings, ...): reported without a traceback."""


def read_records(path: Path) -> list[dict]:
    """Records of a records.jsonl; a last line cut short by an interrupted write is ignored."""
    if not path.is_file():
        return []
    records = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise BenchError(f"{path}:{i + 1}: not valid JSON") from None
            log.warning("%s: ignoring a truncated last line", path)
    return records


def first_mismatch(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length), None when the lists are equal."""
    if list(tokens) == list(reference):
        return None
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
