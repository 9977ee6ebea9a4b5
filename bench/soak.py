"""Soak and fault-injection benchmark of a running `eaglespec serve` (not a timed test).

Protocol:
- closed loop: `--concurrency` client threads (default 16) each send their next request as soon as the previous
  one ends, for `--minutes`; every client draws its actions from its own seeded generator (`--seed`);
- each request is one of (probabilities fixed here, so runs compare):
    normal      (47%) /v1/completions, streamed or not, mixed max_tokens (4..`--max-tokens`), temperature 0 / 0.7
                / 1.0, sometimes stop strings, speculation on / off / server default; the greedy ones without
                stop strings are kept for the offline comparison;
    disconnect  (33%) a stream that the client closes after a random number of chunks (0..6): never a failure
                by itself, but the server must free the row;
    refuse      (12%) a request the server must refuse with a 4xx: over-long prompt, max_tokens past the model
                length, temperature 3, top_p 0, logit_bias, an unknown model (a filesystem path);
    cancel      ( 8%) a request whose client gives up after 20 ms, usually while it still waits for a row;
- a failure is: a 5xx, a 2xx for a must-refuse request, a 4xx other than 429 for a valid request, an error event
  inside a stream, a stream without `[DONE]`, a transport error on a request the client did not abandon;
  429 (queue full) is counted, not a failure;
- every `--sample-s` seconds a sampler records the server's RSS (psutil, `--server-pid`) and the KV rows in use
  and the queue depth from /metrics; latency p50/p99 of the normal requests are reported per minute;
- at the end the clients stop, the server must reach zero running and queued requests within 30 s (every row
  freed), and each distinct greedy request is compared with offline `Engine.generate` (`--offline-model`, a
  vanilla engine on the same checkpoint): the texts must be identical;
- raw records (one per request, one per sample) and the summary go to `--out` (JSONL); the summary is printed.

Usage:
  eaglespec serve --max-batch-size 8 --max-queue 64 --port 8000 &
  python bench/soak.py --url http://127.0.0.1:8000 --model SmolLM2-135M-Instruct.Q4_1 --minutes 30 \\
      --server-pid $! --offline-model default --out results/soak.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

PROMPTS = [
    "The quick brown fox", "def add(a, b):", "1 2 3 4 5 6", "Speculative decoding", "Name three rivers.",
    "Once upon a time", "The capital of France is", "import numpy as np\n", "Dear team,", "Q: What is 2+2?\nA:",
]
STOPS = [[" the"], ["\n"], [".", "!"], ["e"]]
KINDS = [("normal", 47), ("disconnect", 33), ("refuse", 12), ("cancel", 8)]


@dataclass
class Record:
    kind: str
    t: float  # seconds since the start of the run
    status: int | None = None
    latency_s: float | None = None
    ok: bool = True
    problem: str | None = None
    text: str | None = None
    finish_reason: str | None = None
    greedy_key: list | None = None  # [prompt, max_tokens] of a greedy request without stop strings
    extra: dict = field(default_factory=dict)


def metrics(http: httpx.Client, url: str) -> dict[tuple, float]:
    r = http.get(f"{url}/metrics", timeout=10)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def occupancy(m: dict[tuple, float]) -> tuple[float, float]:
    """(KV rows in use over all engines, queued requests) from a /metrics scrape."""
    running = sum(v for (name, _), v in m.items() if name == "eaglespec_running_requests")
    queued = sum(v for (name, _), v in m.items() if name == "eaglespec_queue_depth")
    return running, queued


def _refusal(rng: random.Random, model: str, max_model_len: int) -> dict:
    base = {"model": model, "prompt": rng.choice(PROMPTS), "max_tokens": 4}
    return rng.choice([
        {**base, "prompt": [5] * (max_model_len + 1)},
        {**base, "max_tokens": max_model_len},
        {**base, "temperature": 3},
        {**base, "top_p": 0},
        {**base, "logit_bias": {"5": 10}},
        {**base, "model": "/etc/passwd"},
    ])


def one_request(http: httpx.Client, url: str, model: str, max_model_len: int, max_tokens: int, rng: random.Random,
                t0: float, timeout: float = 120.0) -> Record:
    kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
    rec = Record(kind, time.perf_counter() - t0)
    prompt = rng.choice(PROMPTS)
    n = rng.randint(4, max_tokens)
    temperature = rng.choice([0.0, 0.0, 0.7, 1.0])
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": temperature,
            "stream": rng.random() < 0.5}
    if temperature > 0:
        body["seed"] = rng.randrange(1 << 31)
    if rng.random() < 0.25:
        body["stop"] = rng.choice(STOPS)
    spec = rng.choice([None, True, False])
    if spec is not None:
        body["speculative"] = spec
    if temperature == 0 and "stop" not in body:
        rec.greedy_key = [prompt, n]
    start = time.perf_counter()
    try:
        if kind == "refuse":
            r = http.post(f"{url}/v1/completions", json=_refusal(rng, model, max_model_len), timeout=timeout)
            rec.status = r.status_code
            if not 400 <= r.status_code < 500 or r.status_code == 429 or "error" not in r.json():
                rec.ok, rec.problem = False, f"must-refuse request answered {r.status_code}: {r.text[:200]}"
        elif kind == "cancel":
            with httpx.Client(timeout=httpx.Timeout(0.02)) as quick:
                try:
                    quick.post(f"{url}/v1/completions", json={**body, "stream": False})
                except httpx.TimeoutException:
                    pass  # gave up: expected
        elif kind == "disconnect" or body["stream"]:
            stop_after = rng.randint(0, 6) if kind == "disconnect" else None
            with http.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=timeout) as r:
                rec.status = r.status_code
                if r.status_code != 200:
                    r.read()
                    _check_status(rec, r.status_code, r.text)
                    return rec
                text, events, done = "", 0, False
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    event = json.loads(line[6:])
                    if "error" in event:
                        rec.ok, rec.problem = False, f"error event: {event['error']}"
                        return rec
                    for c in event.get("choices", []):
                        text += c.get("text") or ""
                        rec.finish_reason = c.get("finish_reason") or rec.finish_reason
                    events += 1
                    if stop_after is not None and events >= stop_after:
                        rec.extra["closed_after_events"] = events
                        return rec  # leaving the block closes the connection mid-stream
                if stop_after is None and not done:
                    rec.ok, rec.problem = False, "stream ended without [DONE]"
                rec.text = text
        else:
            r = http.post(f"{url}/v1/completions", json=body, timeout=timeout)
            rec.status = r.status_code
            if r.status_code == 200:
                out = r.json()
                rec.text, rec.finish_reason = out["choices"][0]["text"], out["choices"][0]["finish_reason"]
            else:
                _check_status(rec, r.status_code, r.text)
    except httpx.HTTPError as e:
        rec.ok, rec.problem = False, f"{type(e).__name__}: {e}"
    rec.latency_s = time.perf_counter() - start
    if kind != "normal":
        rec.greedy_key = None
    return rec


def _check_status(rec: Record, status: int, text: str) -> None:
    if status != 429:  # queue full: allowed under load
        rec.ok, rec.problem = False, f"valid request answered {status}: {text[:200]}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_soak(url: str, model: str, seconds: float, concurrency: int = 16, max_tokens: int = 48, seed: int = 0,
             server_pid: int | None = None, sample_s: float = 1.0,
             offline: Callable[[str, int], str] | None = None, out: str | None = None,
             request_timeout: float = 120.0) -> dict:
    """Run the soak; returns the summary (see the module docstring). `offline(prompt, max_tokens)` -> greedy text."""
    import psutil

    proc = psutil.Process(server_pid) if server_pid else None
    http = httpx.Client(timeout=60)
    max_model_len = http.get(f"{url}/v1/models").json()["data"][0]["max_model_len"]
    t0 = time.perf_counter()
    deadline = t0 + seconds
    records: list[Record] = []
    samples: list[dict] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        with httpx.Client() as c:
            while time.perf_counter() < deadline:
                rec = one_request(c, url, model, max_model_len, max_tokens, rng, t0, request_timeout)
                with lock:
                    records.append(rec)

    def sampler() -> None:
        while not stop.is_set():
            running, queued = occupancy(metrics(http, url))
            samples.append({"t": time.perf_counter() - t0, "rss_mb": proc.memory_info().rss / 2**20 if proc else None,
                            "running": running, "queued": queued})
            stop.wait(sample_s)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    sampler_thread = threading.Thread(target=sampler, daemon=True)
    sampler_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    # Every row and queue slot must come free once the clients are gone (abandoned requests included).
    freed_after = None
    while time.perf_counter() - t0 < wall + 30:
        running, queued = occupancy(metrics(http, url))
        if running == 0 and queued == 0:
            freed_after = time.perf_counter() - t0 - wall
            break
        time.sleep(0.1)
    stop.set()
    sampler_thread.join()

    mismatches = []
    if offline is not None:
        expected: dict[tuple, str] = {}
        for r in records:
            if r.greedy_key and r.ok and r.text is not None and r.status == 200:
                key = tuple(r.greedy_key)
                if key not in expected:
                    expected[key] = offline(*key)
                if r.text != expected[key]:
                    mismatches.append({"prompt": key[0], "max_tokens": key[1], "server": r.text,
                                       "offline": expected[key]})
    final = metrics(http, url)
    http.close()
    normal = [r for r in records if r.kind == "normal" and r.ok and r.status == 200]
    per_minute = []
    for m in range(int(wall // 60) + 1):
        lat = [r.latency_s for r in normal if m * 60 <= r.t < (m + 1) * 60]
        per_minute.append({"minute": m, "requests": len(lat), "p50_s": _pct(lat, 0.5), "p99_s": _pct(lat, 0.99)})
    rss = [s["rss_mb"] for s in samples if s["rss_mb"] is not None]
    failures = [r for r in records if not r.ok]
    summary = {
        "type": "summary", "url": url, "model": model, "seconds": round(wall, 1), "concurrency": concurrency,
        "seed": seed, "cpu": cpu_model(), "requests": len(records),
        "by_kind": dict(Counter(r.kind for r in records)),
        "status": dict(Counter(str(r.status) for r in records)),
        "failures": len(failures), "failure_examples": [asdict(r) for r in failures[:5]],
        "latency_p50_s": _pct([r.latency_s for r in normal], 0.5),
        "latency_p99_s": _pct([r.latency_s for r in normal], 0.99), "per_minute": per_minute,
        "rss_mb_start": rss[0] if rss else None, "rss_mb_end": rss[-1] if rss else None,
        "rss_mb_max": max(rss) if rss else None,
        "max_running": max((s["running"] for s in samples), default=None),
        "closed_mid_stream": sum(1 for r in records if "closed_after_events" in r.extra),
        "freed_after_s": freed_after, "greedy_compared": sum(1 for r in records if r.greedy_key and r.text is not None),
        "greedy_mismatches": len(mismatches), "mismatch_examples": mismatches[:3],
        "finished_by_reason": {dict(k[1]).get("finish_reason"): v for k, v in final.items()
                               if k[0] == "eaglespec_requests_finished_total"},
    }
    if out:
        with open(out, "a", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps({"type": "request", **asdict(r)}) + "\n")
            for s in samples:
                f.write(json.dumps({"type": "sample", **s}) + "\n")
            f.write(json.dumps(summary) + "\n")
    return summary


def offline_reference(model_path: str, dtype: str = "float32") -> Callable[[str, int], str]:
    """Greedy text from a vanilla Engine on `model_path` (the server's checkpoint), for the comparison."""
    import torch

    from eaglespec.config import GenerationConfig, SamplingParams
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.runtime.loading import load_target

    target = load_target(None if model_path == "default" else model_path, dtype=dtype)
    engine = Engine(target)

    def run(prompt: str, max_tokens: int) -> str:
        with torch.inference_mode():
            ids = target.tokenizer.encode(prompt)
            return engine.generate([Request(ids, GenerationConfig(max_tokens, SamplingParams(0.0)))])[0].text

    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-pid", type=int, default=None, help="pid of the server process (RSS samples)")
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--offline-model", default=None,
                   help="the server's --model (path or 'default') for the greedy comparison; none = skip it")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", default=None, help="JSONL file for the records and the summary (appended)")
    args = p.parse_args()
    offline = offline_reference(args.offline_model, args.dtype) if args.offline_model else None
    summary = run_soak(args.url, args.model, args.minutes * 60, args.concurrency, args.max_tokens, args.seed,
                       args.server_pid, args.sample_s, offline, args.out)
    print(json.dumps(summary, indent=2))
    return 0 if summary["failures"] == 0 and summary["greedy_mismatches"] == 0 and summary["freed_after_s"] is not None \
        else 1


if __name__ == "__main__":
    raise SystemExit(main())
