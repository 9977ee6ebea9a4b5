"""Load benchmark of a running `eaglespec serve`: throughput and latency vs concurrency, speculation on vs off.

Protocol (written once, followed by every arm):
- fixed prompts: the first turns of an MT-bench style JSONL (`--prompts`), through the chat endpoint, greedy;
- every request generates exactly `--max-tokens` tokens (`ignore_eos` extension), so all arms produce the
  same token counts; the arm is the per-request `speculative` extension (true / false);
- closed loop: `c` client workers each send their next request as soon as the previous one ends, until
  `--requests` requests have been sent; arms and concurrencies run one after another, never overlapping;
- warm-up: `c` unreported requests per (arm, concurrency) before timing;
- per request (streamed, SSE): TTFT = send -> first content chunk; ITL = gaps between consecutive content
  chunks (one chunk may carry several tokens under speculation); TPOT = (last chunk - first chunk) /
  (completion tokens - 1); failures = non-200 answers, error events, missing `[DONE]`, wrong token counts;
- per run: requests/s = successful requests / wall time (first send -> last answer); output tokens/s =
  completion tokens of successful requests / wall time; server-side tau (mean acceptance length) from the
  /metrics deltas of the run;
- raw records (one per request) and one summary per run are appended to `--out` (JSONL); the table is
  printed at the end and can be printed again from the file with `--report FILE`.

Usage (start the server first, e.g. `eaglespec serve --max-batch-size 16`):
  python bench/load.py --prompts path/to/mt_bench/question.jsonl --concurrency 1,4,16 \\
      --arms speculative,vanilla --requests 32 --max-tokens 128 --out results/load.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families



def read_prompts(path: str) -> list[str]:
    """First turns (`turns[0]`, else `prompt`) of an MT-bench style JSONL. (The client needs only httpx, numpy
    and prometheus-client, not the eaglespec package, so it can run on another machine than the server.)"""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                rec = json.loads(line)
                turns = rec.get("turns") or [rec.get("prompt")]
                if not isinstance(turns[0], str):
                    raise SystemExit(f"{path}:{lineno}: no `turns` list or `prompt` string")
                prompts.append(turns[0])
    if not prompts:
        raise SystemExit(f"{path}: no prompts")
    return prompts


@dataclass
class RequestRecord:
    arm: str
    concurrency: int
    prompt_index: int
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    tpot_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


async def one_request(http: httpx.AsyncClient, url: str, body: dict, rec: RequestRecord, max_tokens: int) -> None:
    t0 = time.perf_counter()
    arrivals: list[float] = []
    done = False
    try:
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    rec.error = event["error"].get("message", "error event")
                    return
                if event.get("usage"):
                    rec.prompt_tokens = event["usage"]["prompt_tokens"]
                    rec.completion_tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    if choice["delta"].get("content"):
                        arrivals.append(time.perf_counter())
                    rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        rec.error = f"{type(e).__name__}: {e}"
        return
    rec.latency_s = time.perf_counter() - t0
    if not done:
        rec.error = "stream ended without [DONE]"
    elif rec.completion_tokens != max_tokens:
        rec.error = f"{rec.completion_tokens} completion tokens, expected {max_tokens}"
    elif not arrivals:
        rec.error = "no content chunks"
    else:
        rec.ok = True
        rec.ttft_s = arrivals[0] - t0
        rec.itl_s = [b - a for a, b in itertools.pairwise(arrivals)]
        if rec.completion_tokens > 1:
            rec.tpot_s = (arrivals[-1] - arrivals[0]) / (rec.completion_tokens - 1)


def request_body(model: str, prompt: str, arm: str, max_tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "speculative": arm == "speculative"}


async def run_load(http: httpx.AsyncClient, url: str, model: str, prompts: list[str], arm: str, concurrency: int,
                   n_requests: int, max_tokens: int) -> tuple[list[RequestRecord], float]:
    """Closed loop with `concurrency` workers; returns the records and the wall time."""
    todo = asyncio.Queue()
    for i in range(n_requests):
        todo.put_nowait(i % len(prompts))
    records: list[RequestRecord] = []

    async def worker() -> None:
        while not todo.empty():
            i = todo.get_nowait()
            rec = RequestRecord(arm, concurrency, i)
            await one_request(http, url, request_body(model, prompts[i], arm, max_tokens), rec, max_tokens)
            records.append(rec)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records, time.perf_counter() - t0


def scrape(http_sync: httpx.Client, url: str) -> dict[str, float]:
    r = http_sync.get(f"{url}/metrics")
    r.raise_for_status()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(records: list[RequestRecord], wall_s: float, before: dict, after: dict, meta: dict) -> dict:
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in ok]
    itl = [g for r in ok for g in r.itl_s]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    forwards = after.get("eaglespec_spec_target_forwards_total", 0) - before.get("eaglespec_spec_target_forwards_total", 0)
    decode = after.get("eaglespec_spec_decode_tokens_total", 0) - before.get("eaglespec_spec_decode_tokens_total", 0)
    s = {"type": "summary", **meta, "requests": len(records), "failed": len(records) - len(ok), "wall_s": wall_s,
         "requests_per_s": len(ok) / wall_s, "output_tokens_per_s": sum(r.completion_tokens for r in ok) / wall_s,
         "server_tau": decode / forwards if forwards else None}
    for name, values in (("ttft", ttft), ("itl", itl), ("tpot", tpot)):
        for q in (50, 90, 99):
            s[f"{name}_p{q}_ms"] = None if not values else 1000 * pct(values, q)
    return s


def print_table(summaries: list[dict]) -> None:
    cols = [("arm", "arm", "{}"), ("conc", "concurrency", "{}"), ("req", "requests", "{}"), ("fail", "failed", "{}"),
            ("req/s", "requests_per_s", "{:.2f}"), ("tok/s", "output_tokens_per_s", "{:.1f}"),
            ("tau", "server_tau", "{:.2f}"),
            ("TTFT p50/p90/p99 ms", ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"), "{:.0f}"),
            ("ITL p50/p90/p99 ms", ("itl_p50_ms", "itl_p90_ms", "itl_p99_ms"), "{:.1f}"),
            ("TPOT p50 ms", "tpot_p50_ms", "{:.1f}")]

    def cell(s: dict, key, fmt: str) -> str:
        keys = key if isinstance(key, tuple) else (key,)
        return "/".join("-" if s.get(k) is None else fmt.format(s[k]) for k in keys)

    rows = [[cell(s, key, fmt) for _, key, fmt in cols] for s in summaries]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, (h, _, _) in enumerate(cols)]
    print("  ".join(h.ljust(w) for (h, _, _), w in zip(cols, widths)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


async def main_async(args: argparse.Namespace) -> list[dict]:
    prompts = read_prompts(args.prompts)[: args.n_prompts]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    timeout = httpx.Timeout(args.timeout)
    summaries = []
    with httpx.Client(headers=headers, timeout=30) as http_sync:
        model = args.model or http_sync.get(f"{args.url}/v1/models").json()["data"][0]["id"]
        facts = {"server": args.url, "model": model, "client_python": platform.python_version(),
                 "client_machine": platform.machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits) as http:
            with open(args.out, "a", encoding="utf-8") as out:
                for arm in args.arms:
                    for c in args.concurrency:
                        await run_load(http, args.url, model, prompts, arm, c, c, args.warmup_tokens)  # warm-up
                        before = scrape(http_sync, args.url)
                        records, wall = await run_load(http, args.url, model, prompts, arm, c, args.requests,
                                                       args.max_tokens)
                        after = scrape(http_sync, args.url)
                        meta = {"arm": arm, "concurrency": c, "max_tokens": args.max_tokens,
                                "n_prompts": len(prompts), **facts}
                        s = summarize(records, wall, before, after, meta)
                        out.writelines(json.dumps({"type": "request", **asdict(r)}) + "\n" for r in records)
                        out.write(json.dumps(s) + "\n")
                        out.flush()
                        summaries.append(s)
                        print(f"{arm} c={c}: {s['requests_per_s']:.2f} req/s, {s['output_tokens_per_s']:.1f} tok/s, "
                              f"{s['failed']} failed", file=sys.stderr)
    return summaries


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (without /v1)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    p.add_argument("--prompts", help="MT-bench style JSONL (first turns are used)")
    p.add_argument("--n-prompts", type=int, default=80, help="use the first N prompts (cycled)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client concurrencies")
    p.add_argument("--arms", default="speculative,vanilla", help="comma-separated: speculative, vanilla")
    p.add_argument("--requests", type=int, default=32, help="timed requests per (arm, concurrency)")
    p.add_argument("--max-tokens", type=int, default=128, help="generated tokens per request (EOS ignored)")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens of each unreported warm-up request")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    p.add_argument("--out", default="load.jsonl", help="JSONL file the records are appended to")
    p.add_argument("--report", default=None, metavar="FILE", help="only print the table of an existing JSONL file")
    args = p.parse_args()
    if args.report:
        with open(args.report, encoding="utf-8") as f:
            print_table([r for r in map(json.loads, f) if r.get("type") == "summary"])
        return 0
    if not args.prompts:
        p.error("--prompts is required (an MT-bench style question.jsonl)")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.arms = [a.strip() for a in args.arms.split(",")]
    bad = [a for a in args.arms if a not in ("speculative", "vanilla")]
    if bad or min(args.concurrency) < 1 or args.requests < 1 or args.max_tokens < 1:
        p.error(f"bad arguments: arms must be speculative/vanilla (got {bad or 'ok'}), concurrency, requests "
                f"and max tokens >= 1")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    print_table(asyncio.run(main_async(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
