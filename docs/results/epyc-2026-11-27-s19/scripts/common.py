# Session 12's helpers (docs/results/xeon-2026-11-27-s12/scripts/common.py: MT-bench requests, proposers), with
# the MT-bench file read from the data dir $D (default ../shared/data) instead of that session's path.
import importlib.util
import os
from pathlib import Path

_path = Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts" / "common.py"
_spec = importlib.util.spec_from_file_location("s12_common", _path)
_s12 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s12)
_s12.MT_BENCH = "mt_bench=" + os.environ.get("D", "../shared/data") + "/mt_bench/question.jsonl"
mt_bench_requests, proposer = _s12.mt_bench_requests, _s12.proposer
