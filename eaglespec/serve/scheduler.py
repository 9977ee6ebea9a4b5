"""Continuous batching for the server: one thread owns the Engines; requests join and leave between steps.

The HTTP side (an asyncio event loop) never touches torch. It hands the scheduler a `Job` (tokenized prompt,
GenerationConfig, which engine) and reads the job's events from an asyncio.Queue. The scheduler thread loops:

    take new submissions and cancellations from the inbox  ->  Engine.submit / Engine.cancel
    step every engine that has work                         ->  prefill newcomers or decode one step
    route each Chunk to its job (loop.call_soon_threadsafe), retire finished jobs, update the metrics

and sleeps on a condition variable when every engine is idle and the inbox is empty.

Two engines share the target model: "speculative" (with the proposer) and "vanilla" (without), so a request
can turn speculation off (`"speculative": false`) without changing the generation loop. Each engine has its
own KV cache of `max_batch_size` rows; the scheduler steps them in turn, so both kinds decode concurrently.

Admission control: a request waits when its engine's rows are all taken; when `max_queue` requests are already
waiting (over all engines), a new one is refused with QueueFull instead of queueing without bound.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from eaglespec.config import GenerationConfig
from eaglespec.engine.generate import Chunk, Completion, Engine, Request
from eaglespec.engine.stats import SequenceStats

log = logging.getLogger(__name__)

SPECULATIVE, VANILLA = "speculative", "vanilla"
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)


class QueueFull(Exception):
    """The bounded waiting queue is full: the client should retry later."""


class ShuttingDown(Exception):
    """The scheduler is stopping (or has stopped) and takes no more work."""


@dataclass
class Job:
    """One request as the scheduler sees it. `events` receives, in order:
    ("chunk", Chunk)* then ("done", Completion), or ("error", status, message) at any point."""

    key: int
    engine: str
    prompt_ids: list[int]
    config: GenerationConfig
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrival: float = field(default_factory=time.perf_counter)
    last_chunk: float | None = None  # scheduler thread only
    closed: bool = False  # set on the event loop once the final event was received

    def send(self, event: tuple) -> None:
        """Thread-safe hand-off to the event loop that owns `events`."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class ServerMetrics:
    """Prometheus metrics of one server (own registry, so several servers can live in one process)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter("eaglespec_requests", "HTTP requests by route and status code", ["route", "status"],
                                registry=r)
        self.finished = Counter("eaglespec_requests_finished", "Generation requests that ended, by finish reason "
                                "(stop, length, cancelled = client gone, error)", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("eaglespec_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("eaglespec_generation_tokens", "Generated tokens sent to clients",
                                         registry=r)
        self.queue_depth = Gauge("eaglespec_queue_depth", "Requests waiting for a free KV-cache row", registry=r)
        self.running = Gauge("eaglespec_running_requests", "Sequences in the running batch, per engine",
                             ["engine"], registry=r)
        self.spec_decode_tokens = Counter(
            "eaglespec_spec_decode_tokens", "Tokens committed by decode steps (after prefill) of finished "
            "speculative requests", registry=r)
        self.spec_forwards = Counter("eaglespec_spec_target_forwards", "Target verification forwards of finished "
                                     "speculative requests (= verification rounds)", registry=r)
        self.tau = Gauge("eaglespec_mean_acceptance_length", "tau = spec decode tokens / spec target "
                                     "forwards (bonus token included; 1 = no gain)", registry=r)
        self.accepted = Counter("eaglespec_spec_accepted_per_position", "Verification rounds in which the draft "
                                "token at this depth was accepted (divide by spec_target_forwards for the rate)",
                                ["position"], registry=r)
        self.tree_rounds = Counter("eaglespec_spec_tree_rounds", "Verification rounds of finished speculative "
                                   "requests by the tree drafted (none = a plain step while the dispatcher paused "
                                   "drafting)", ["tree"], registry=r)
        self.predicted_speedup = Gauge(
            "eaglespec_spec_predicted_speedup", "Speedup over plain decoding that the cost model predicted for the "
            "trees the dispatcher chose, pooled over finished speculative requests (predicted tokens/s over "
            "calibrated plain tokens/s; measuring it needs a plain run of the same prompts: eaglespec bench)",
            registry=r)
        self.cost_ratio = Gauge(
            "eaglespec_spec_cost_ratio", "Measured over calibrated seconds of the speculative engine's steps "
            "(decayed mean), by batch size, tree (none = a plain step while paused) and band of context tokens: "
            "the dispatcher's step-cost feedback (docs/DISPATCH.md, 'Prices, online')", ["batch", "tree", "context"],
            registry=r)
        self.cost_factor = Gauge(
            "eaglespec_spec_cost_factor", "The step-cost feedback's correction of a tree's calibrated price "
            "(1 = as calibrated), by batch size, tree and band of context tokens", ["batch", "tree", "context"],
            registry=r)
        self.ttft = Histogram("eaglespec_time_to_first_token_seconds", "Request arrival to its first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("eaglespec_inter_token_latency_seconds", "Per output token after the first: the gap "
                             "between two chunks of a request divided by the tokens of the later chunk",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self._spec = SequenceStats(sequences=0)  # finished speculative requests, pooled (scheduler thread only)

    def on_chunk(self, job: Job, chunk: Chunk, now: float) -> None:
        n = len(chunk.token_ids)
        self.generation_tokens.inc(n)
        if job.last_chunk is None:
            self.ttft.observe(now - job.arrival)
            n -= 1  # the first token's latency is the TTFT
            gap = 0.0
        else:
            gap = (now - job.last_chunk) / max(1, n)
        for _ in range(n):
            self.itl.observe(gap)
        job.last_chunk = now

    def on_finish(self, job: Job, c: Completion) -> None:
        self.finished.labels(c.finish_reason).inc()
        st = c.stats
        if job.engine != SPECULATIVE or st.target_forwards == 0:
            return
        self._spec = SequenceStats.pooled([self._spec, st])
        self.spec_decode_tokens.inc(st.decode_tokens)
        self.spec_forwards.inc(st.target_forwards)
        self.tau.set(self._spec.tau)
        for d, count in enumerate(st.accepted_per_position, 1):
            self.accepted.labels(str(d)).inc(count)
        for label, rounds in st.tree_rounds.items():
            self.tree_rounds.labels(label).inc(rounds)
        if self._spec.predicted_speedup is not None:
            self.predicted_speedup.set(self._spec.predicted_speedup)

    def on_feedback(self, feedback) -> None:
        """The state of the speculative engine's step-cost feedback (``costmodel.StepCostFeedback``)."""
        for e in feedback.snapshot():
            labels = (str(e["batch"]), e["tree"], "any" if e["context"] is None else "%d-%d" % tuple(e["context"]))
            self.cost_ratio.labels(*labels).set(e["ratio"])
            if e["tree"] != "none":
                self.cost_factor.labels(*labels).set(e["factor"])


class Scheduler:
    """Owns the engines and their thread; `submit`/`cancel` may be called from any thread."""

    def __init__(self, engine_factories: dict[str, Callable[[], Engine]], max_queue: int, metrics: ServerMetrics,
                 warmup: bool = True):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self._factories = engine_factories
        self.engines = {name: make() for name, make in engine_factories.items()}
        self.max_queue = max_queue
        self.metrics = metrics
        self.warmup = warmup
        self.ready = threading.Event()
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, Job]] = []
        self._jobs: dict[int, Job] = {}  # submitted and not finished (scheduler thread only)
        self._in_flight = {name: 0 for name in self.engines}  # accepted and not finished, per engine (under _cond)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="eaglespec-scheduler", daemon=True)

    # ------------------------------------------------------------------------------------ any thread

    def limits(self, engine: str) -> tuple[int, int]:
        """(KV slots per row, draft slack) of an engine: prompt + max_tokens + slack must fit the slots."""
        e = self.engines[engine]
        return e.max_len, e.slack

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def queue_depth(self) -> int:
        with self._cond:
            return self._waiting()

    def submit(self, job: Job) -> None:
        """Accept a job or raise QueueFull / ShuttingDown. Its events start arriving on job.events."""
        with self._cond:
            if self._stopping or not self._thread.is_alive():
                raise ShuttingDown("the server is shutting down")
            rows = self.engines[job.engine].max_batch_size
            if self._in_flight[job.engine] >= rows and self._waiting() >= self.max_queue:
                raise QueueFull(f"the server is busy: {self._waiting()} requests are already waiting for a free "
                                f"slot (--max-queue {self.max_queue}); retry later")
            self._in_flight[job.engine] += 1
            self._inbox.append(("submit", job))
            self.metrics.queue_depth.set(self._waiting())
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Drop a job (its client went away); frees its cache row. A no-op once the job has finished."""
        with self._cond:
            self._inbox.append(("cancel", job))
            self._cond.notify()

    def _waiting(self) -> int:
        """Accepted jobs beyond their engine's rows (call with _cond held)."""
        return sum(max(0, n - self.engines[e].max_batch_size) for e, n in self._in_flight.items())

    # ------------------------------------------------------------------------------ scheduler thread

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                if self.warmup:
                    self._warm_up()
                self.ready.set()
                self._loop()
        except Exception:
            log.exception("the scheduler thread failed; the server stops taking requests")
        finally:
            with self._cond:
                self._stopping = True
                pending, self._inbox = self._inbox, []
            for job in list(self._jobs.values()):
                self._fail(job, 503, "the server is shutting down")
            for op, job in pending:
                if op == "submit":
                    job.send(("error", 503, "the server is shutting down"))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self._stopping and all(e.idle for e in self.engines.values()):
                    self._cond.wait()
                if self._stopping:
                    return
                ops, self._inbox = self._inbox, []
            for op, job in ops:
                if op == "submit":
                    self._submit(job)
                else:
                    self._cancel(job)
            for name in self.engines:
                if not self.engines[name].idle:
                    self._step(name)
            self._update_gauges()

    def _warm_up(self) -> None:
        """One short request per engine: allocates the KV caches and runs the first (slow) forwards now."""
        for name, engine in self.engines.items():
            t0 = time.perf_counter()
            engine.submit(("warmup", name), Request(list(range(1, 5)), GenerationConfig(4, ignore_eos=True)))
            while not engine.idle:
                engine.step()
            log.info("warmed up the %s engine in %.2f s", name, time.perf_counter() - t0)

    def _submit(self, job: Job) -> None:
        try:
            self.engines[job.engine].submit(job.key, Request(job.prompt_ids, job.config))
        except ValueError as e:  # the HTTP side validates first; this is a last line of defence
            self._release(job)
            job.send(("error", 400, str(e)))
            return
        self._jobs[job.key] = job
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))

    def _cancel(self, job: Job) -> None:
        if self._jobs.pop(job.key, None) is None:
            return  # finished (or failed) already
        self.engines[job.engine].cancel(job.key)
        self._release(job)
        self.metrics.finished.labels("cancelled").inc()

    def _step(self, name: str) -> None:
        finished: list[Completion] = []
        try:
            chunks = self.engines[name].step(on_finish=finished.append)
        except Exception:
            # The engine's state is unknown after a failure: fail its jobs and start a fresh one.
            log.exception("the %s engine failed; its requests are aborted", name)
            for job in [j for j in self._jobs.values() if j.engine == name]:
                self._fail(job, 500, "internal error while generating (see the server log)")
            self.engines[name] = self._factories[name]()
            return
        now = time.perf_counter()
        for chunk in chunks:
            job = self._jobs.get(chunk.index)
            if job is not None:
                self.metrics.on_chunk(job, chunk, now)
                job.send(("chunk", chunk))
        for c in finished:
            job = self._jobs.pop(c.index, None)
            if job is not None:
                self._release(job)
                self.metrics.on_finish(job, c)
                job.send(("done", c))
        feedback = getattr(getattr(self.engines[name].proposer, "dispatcher", None), "feedback", None)
        if finished and feedback is not None:
            self.metrics.on_feedback(feedback)

    def _fail(self, job: Job, status: int, message: str) -> None:
        self._jobs.pop(job.key, None)
        self._release(job)
        self.metrics.finished.labels("error").inc()
        job.send(("error", status, message))

    def _release(self, job: Job) -> None:
        with self._cond:
            self._in_flight[job.engine] -= 1
            self.metrics.queue_depth.set(self._waiting())

    def _update_gauges(self) -> None:
        for name, engine in self.engines.items():
            self.metrics.running.labels(name).set(len(engine.active))
