"""bench/soak.py for a few seconds against a tiny-model server (uvicorn in a thread, random EAGLE-3 head, fewer
rows than clients so requests queue and some get 429): loose bounds on correctness only, no timings. No
failures (every must-refuse request refused, every valid one answered or 429), every row freed once the clients
are gone, greedy outputs identical to offline generation on a separately built identical target."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.engine.generate import Engine, Request
from eaglespec.spec.heads import DraftHead, save_head
from eaglespec.serve.server import ServerConfig, create_app
from eaglespec.spec.speculative import DraftOptions, build_proposer
from helpers import tiny_target
from test_server import serving

SOAK = Path(__file__).resolve().parents[1] / "bench" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_soak_for_a_few_seconds(tmp_path):
    soak = load_soak()
    target, _ = tiny_target(seed=0)
    torch.manual_seed(0)
    head = save_head(DraftHead.for_target(target.model, "eagle3", draft_vocab_size=64), tmp_path / "head")
    proposer = build_proposer(target, DraftOptions(draft=str(head), tree="dynamic", depth=4))
    app = create_app(target, proposer, ServerConfig("tiny", max_batch_size=4, max_queue=8, max_model_len=128))

    reference, _ = tiny_target(seed=0)
    engine = Engine(reference)

    def offline(prompt: str, max_tokens: int) -> str:
        with torch.inference_mode():
            ids = reference.tokenizer.encode(prompt)
            return engine.generate([Request(ids, GenerationConfig(max_tokens, SamplingParams(0.0)))])[0].text

    with serving(app) as url:
        summary = soak.run_soak(url, "tiny", seconds=6, concurrency=16, max_tokens=24, seed=0,
                                server_pid=os.getpid(), sample_s=0.5, offline=offline, out=str(tmp_path / "s.jsonl"),
                                request_timeout=20)
    assert summary["failures"] == 0, summary["failure_examples"]
    assert summary["freed_after_s"] is not None, summary
    assert summary["greedy_mismatches"] == 0, summary["mismatch_examples"]
    assert summary["greedy_compared"] >= 3 and set(summary["by_kind"]) >= {"normal", "disconnect", "refuse"}
    assert summary["rss_mb_end"] is not None and summary["finished_by_reason"].get("error", 0) == 0
    # Clients that closed their stream mid-way had their requests cancelled, not decoded to the end.
    assert summary["closed_mid_stream"] >= 5 and summary["finished_by_reason"].get("cancelled", 0) >= 5
    assert (tmp_path / "s.jsonl").read_text().count('"type": "summary"') == 1
