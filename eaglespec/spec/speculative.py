"""Speculation options shared by the CLI, the benchmark and the server: which head, which tree.

`DraftOptions` is the typed form of `--draft/--tree/--depth/--topk/--tree-tokens/--draft-temperature/
--draft-alignment`; `build_proposer` turns it into an `EagleProposer` (or None for vanilla decoding).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.cachedir import cache_root
from eaglespec.runtime.pack import pack_linears
from eaglespec.runtime.quant import FORMATS as PACKED_FORMATS
from eaglespec.spec.strategies import DEFAULT_TREE_TABLE, TREE_KINDS, TreeDispatcher

log = logging.getLogger(__name__)

# The head shipped for the default model (trained by `eaglespec train`, see docs/TRAINING.md).
SHIPPED_HEAD_DIR = Path(__file__).resolve().parents[1] / "assets" / "smollm2-135m-instruct-eagle"


@dataclass(frozen=True)
class DraftOptions:
    draft: str | None = None
    """Head directory; None = the shipped head for the default model (vanilla if there is none); "none" =
    vanilla decoding."""
    tree: str = "auto"
    """A kind of `strategies.TREE_KINDS` ("chain", "static" = EAGLE-1 tree or `tree_paths`, "dynamic" = EAGLE-2,
    "none" = draft nothing, a benchmark baseline) or "auto": the dispatcher that picks the tree per step."""
    depth: int | None = None
    """Chain length / dynamic-tree depth (default: chain 4, dynamic 5)."""
    topk: int | None = None
    """Dynamic tree: children per expanded node and nodes expanded per level (default 4)."""
    tree_tokens: int | None = None
    """Dynamic tree: draft nodes kept after reranking (default 16)."""
    tree_paths: str | None = None
    """Static tree as a JSON list of top-k rank paths, e.g. "[[0],[1],[0,0]]"."""
    draft_temperature: float | None = None
    """None = each request's own temperature (greedy requests draft top-k children, sampled ones sample their
    children at their T where the tree allows: chain and static); 0 = top-k children for every request; > 0 =
    every request samples its children at this temperature (chain/static trees only)."""
    alignment: str = "stable"
    """Draft-KV alignment after verification: "stable" (re-encode accepted tokens with true features) or
    "last" (keep drafted K/V, re-encode only the tail; Meta)."""
    seed: int | None = None
    calibrate: bool = True
    """tree "auto": pick the tree per step from this machine's measured costs and live acceptance
    (dispatch.AdaptiveDispatcher; calibration cached per machine, model, precision and head); False = the
    static table by batch size (strategies.DEFAULT_TREE_TABLE)."""
    cost_feedback: bool = True
    """tree "auto" with calibration: check the calibrated prices against the engine's timed steps and reprice a
    tree that keeps costing more or less than priced (``costmodel.StepCostFeedback``); False: the choice
    depends on acceptance alone, so a seeded run repeats its choices (and its sampled tokens) exactly."""
    max_lag: int = 1024
    """Paused (no-draft) steps whose draft pairs are recorded before the draft cache catches up in one forward
    (proposer.EagleProposer); 0 = encode each at its step (what a paused step cost before; bench `lag=0`).
    Longer than most requests' paused stretches, so that a request which stays paused to its end never pays
    for encoding pairs the head will not draft from (docs/DISPATCH.md). It was 256: batches of 128-token
    requests that stayed paused caught up every 256 steps for rows about to finish: ~1% of their time at batch
    4 on a 2-core Xeon, by the catch-up's measured cost. The buffer grows with the stretch (6.9 KB a pair and
    row for the default head); a full one catches up every row at once, a stall of ~35 us a pair and row."""

    def dispatcher(self) -> TreeDispatcher:
        """The tree strategy per batch size these options ask for (validated: options that do not apply to the
        chosen kind are refused by name). "auto" = the static table; `build_proposer` may replace it with the
        calibrated, acceptance-aware dispatcher."""
        given = {"depth": self.depth, "topk": self.topk, "tree_tokens": self.tree_tokens,
                 "tree_paths": self.tree_paths}
        if self.tree == "auto":
            if any(v is not None for v in given.values()):
                raise ValueError("--depth/--topk/--tree-tokens/--tree-paths need an explicit --tree "
                                 "(chain, static or dynamic), not auto")
            return TreeDispatcher(DEFAULT_TREE_TABLE)
        if self.tree not in TREE_KINDS:
            raise ValueError(f"--tree must be {', '.join(TREE_KINDS)} or auto, got {self.tree!r}")
        return TreeDispatcher({1: TREE_KINDS[self.tree].from_options(**given)})


def resolve_head_dir(opts: DraftOptions, target) -> Path | None:
    """The head directory to use, or None for vanilla decoding."""
    if opts.draft is not None:
        if opts.draft.lower() == "none":
            return None
        path = Path(opts.draft).expanduser()
        if not path.is_dir():
            raise ValueError(f"--draft {opts.draft}: no such directory (expected config.json + model.safetensors)")
        return path
    if getattr(target, "source", None) is not None and target.source.kind == "default":
        if (SHIPPED_HEAD_DIR / "config.json").is_file():
            return SHIPPED_HEAD_DIR
        log.warning("no shipped draft head found at %s: decoding without speculation", SHIPPED_HEAD_DIR)
    return None


def load_draft_head(head_dir, target, dtype=None):
    """The head in ``head_dir`` as decoding runs it next to ``target``: loaded strictly against the target, in
    eval mode, and with int8 weights next to a packed target. Everything that drafts or measures drafting
    (the engine, ``eaglespec calibrate``) loads it here, so that what is calibrated is what runs."""
    from eaglespec.spec.heads import load_head

    head = load_head(head_dir, target.model, dtype=dtype or target.model.dtype, device=target.model.device)
    head.eval().requires_grad_(False)  # decoding never trains it (a trainable head clones its cache per forward)
    if target.model.precision in PACKED_FORMATS and head.dtype == torch.float32:
        # Next to a packed target the float32 head would cost a third of a decode step per draft step;
        # int8 weights read 4x less (measured in docs/RUNTIME.md), at no cost to losslessness. Where our
        # int4 x int8 kernel runs, int4 weights in it draft 27% faster again with the same acceptance (shipped
        # head, 10 MT-bench turns, chain of 1: tau 1.303 vs 1.305, draft time 1.57 vs 2.20 s; RUNTIME.md).
        plans = cache_root() / "plans"  # many-row (catch-up) kernels measured on this machine, as the target's
        if cpu_kernels.available():
            pack_linears(head, "int4", kernel="w4a8", kernel_cache=plans)
            head.layer_steps = head.layer_step_args()  # each layer of a draft step or commit in one call
        else:
            pack_linears(head, "int8", kernel_cache=plans)
    return head


def build_proposer(target, opts: DraftOptions, dtype=None, dispatcher_factory=None):
    """An EagleProposer for `opts` (None = vanilla). The head is loaded strictly against the target.

    ``dispatcher_factory(target, head, head_dir, opts)``: for ``--tree auto`` with ``opts.calibrate``, builds
    the tree dispatcher instead of the static table (``engine.calibrate.build_calibrated_proposer`` passes
    the acceptance-aware one; it lives above this layer because calibration runs the engine)."""
    from eaglespec.spec.proposer import EagleProposer

    head_dir = resolve_head_dir(opts, target)
    trees = opts.dispatcher()  # validate tree options even when decoding without a head
    if head_dir is None:
        return None
    head = load_draft_head(head_dir, target, dtype)
    if opts.tree == "auto" and opts.calibrate and dispatcher_factory is not None:
        trees = dispatcher_factory(target, head, head_dir, opts)
    return EagleProposer(head, trees, alignment=opts.alignment, draft_temperature=opts.draft_temperature,
                         seed=opts.seed, max_lag=opts.max_lag)
