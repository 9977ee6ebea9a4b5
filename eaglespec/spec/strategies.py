"""Tree strategies: one class per kind of draft tree, owning everything about its kind.

A strategy knows its options (the command-line flags it takes, their defaults, and it refuses the others), its
validation, its node count and depth bound, its label (the one name of the tree in `--json`, bench records,
calibration and the dispatcher's choice), whether its children may be sampled from the draft, and how it drafts
(through the small `Drafter` protocol the neural proposer implements). Nothing outside this module switches on
the kind of a tree:

* `StaticTree(paths)`: an EAGLE-1 style tree of top-k rank paths, drafted level by level;
* `Chain(depth)`: the static tree of one path (top-1 at every step);
* `DynamicTree(topk, depth, tree_tokens)`: EAGLE-2's expand-then-rerank tree;
* `NoDraft()`: no speculation, the one representation of it (the tree is the root alone: the target decodes
  one token; a proposer still encodes the committed tokens so it can draft again later).

`TreeDispatcher` maps batch sizes to strategies (`DEFAULT_TREE_TABLE` is the measured default).
Shapes: B = batch rows, K = nodes expanded at one level, H = head hidden size, V = target vocabulary,
N = tree nodes (root included), W = drafted slots visible to a level.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from eaglespec.spec.tree import (
    EAGLE1_TREE_PATHS,
    DraftTree,
    DynamicTreeBuilder,
    TreeShape,
    expand_static,
    static_shape,
    tree_mask,
)

__all__ = [
    "DEFAULT_TREE_TABLE",
    "TREE_KINDS",
    "Chain",
    "Drafter",
    "DynamicTree",
    "NoDraft",
    "StaticTree",
    "TreeDispatcher",
    "TreeStrategy",
    "tree_from_dict",
]


class Drafter(Protocol):
    """What a strategy asks of the neural drafter during one step (bound to that step's rows)."""

    def root_features(self) -> Tensor:
        """[B, 1, H] the draft output of each row's last committed pair: its children are the root's."""

    def children(self, h: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """h [B, K, H] -> k children per node: target token ids [B, K, k], draft log-probs [B, K, k] and, when
        children are sampled, the distribution q [B, K, V] they were drawn from (else None)."""

    def expand(self, parent_h: Tensor, tokens: Tensor, depth: int, mask: Tensor) -> Tensor:
        """Draft pairs (parent output [B, K, H], token [B, K]) of nodes at `depth` >= 1; mask bool [B, K, W]:
        the drafted slots each node sees, the K new ones last. Returns their outputs [B, K, H]."""


def _option_error(kind: str, given: Mapping[str, object]) -> ValueError | None:
    bad = [k.replace("_", "-") for k, v in given.items() if v is not None]
    return ValueError(f"--{', --'.join(bad)} do(es) not apply to a {kind} tree") if bad else None


@dataclass(frozen=True)
class TreeStrategy:
    """One kind of draft tree (abstract). Subclasses are frozen dataclasses: equal options, equal strategy."""

    kind: ClassVar[str]
    """The name of the kind in `--tree` and in dispatch tables ({"kind": ..., options})."""
    options: ClassVar[tuple[str, ...]] = ()
    """The `DraftOptions` fields (flags) this kind takes."""
    drafts: ClassVar[bool] = True
    """False only for `NoDraft`."""
    samples_children: ClassVar[bool] = True
    """Whether children may be SAMPLED from the draft (draft_temperature > 0) and verified by that rule."""

    @classmethod
    def from_options(cls, **given: object) -> TreeStrategy:
        """From `DraftOptions` values (None = not given: the kind's default); options of other kinds are refused."""
        raise NotImplementedError

    @classmethod
    def _refuse_others(cls, given: Mapping[str, object]) -> None:
        err = _option_error(cls.kind, {k: v for k, v in given.items() if k not in cls.options})
        if err is not None:
            raise err

    @property
    def num_nodes(self) -> int:
        """N, root included: every tree of this strategy has exactly N nodes (padding included)."""
        raise NotImplementedError

    @property
    def max_depth(self) -> int:
        """The deepest node's depth (root 0): bounds verification's accepted path."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """Short name, e.g. chain2, static26, dynamic5x4:16, none."""
        raise NotImplementedError

    def draft(self, drafter: Drafter | None, pending: Tensor) -> tuple[DraftTree, Tensor | None]:
        """The step's trees rooted at `pending` int64 [B], and node_slot int64 [B, N]: for each node, the
        drafted slot (offset from the prefix) holding its pair, -1 when it was not expanded; None when no node
        was expanded (a chain of 1, no tree), so that commit has no drafted pair to keep."""
        raise NotImplementedError


def _int_option(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


@functools.lru_cache(maxsize=64)
def _compiled(paths: tuple[tuple[int, ...], ...]) -> TreeShape:
    """Shapes compiled once per set of paths (a strategy's shape is asked for every step)."""
    return static_shape(paths)


@functools.lru_cache(maxsize=64)
def _level_masks(shape: TreeShape, device: str) -> tuple[tuple[Tensor, ...], tuple[int, ...]]:
    """Per drafting level d >= 1: bool [E_d, W_d] ancestor-or-self among drafted (expanded) nodes; and the
    drafted nodes in slot order."""
    parents = shape.parents_tensor(device)[None]  # [1, N]
    anc = tree_mask(parents, torch.ones_like(parents, dtype=torch.bool))[0]  # [N, N]
    drafted: list[int] = []
    masks = []
    for lv in shape.levels[1:]:
        drafted += list(lv.expanded)
        idx = torch.tensor(drafted, device=device)
        masks.append(anc[idx[-len(lv.expanded):]][:, idx])  # [E_d, W_d]
    return tuple(masks), tuple(drafted)


@dataclass(frozen=True)
class StaticTree(TreeStrategy):
    """A fixed tree of top-k rank paths, e.g. ((0,), (1,), (0, 0)); default: the EAGLE-1 reference tree."""

    paths: tuple[tuple[int, ...], ...] = EAGLE1_TREE_PATHS

    kind: ClassVar[str] = "static"
    options: ClassVar[tuple[str, ...]] = ("tree_paths",)

    def __post_init__(self) -> None:
        paths = self.paths
        if isinstance(paths, Sequence) and not isinstance(paths, (str, bytes)):
            paths = tuple(tuple(p) if isinstance(p, Sequence) and not isinstance(p, (str, bytes)) else p
                          for p in paths)
        object.__setattr__(self, "paths", paths)
        static_shape(paths)  # validates, naming the bad path

    @classmethod
    def from_options(cls, tree_paths: str | None = None, **given: object) -> StaticTree:
        cls._refuse_others(given)
        if tree_paths is None:
            return cls()
        try:
            return cls(json.loads(tree_paths))
        except json.JSONDecodeError as e:
            raise ValueError(f"--tree-paths is not valid JSON: {e.msg}") from None

    @property
    def shape(self) -> TreeShape:
        return _compiled(self.paths)

    @property
    def num_nodes(self) -> int:
        return self.shape.num_nodes

    @property
    def max_depth(self) -> int:
        return self.shape.max_depth

    @property
    def label(self) -> str:
        return f"static{self.num_nodes}"

    def draft(self, drafter: Drafter, pending: Tensor) -> tuple[DraftTree, Tensor]:
        """Level by level: expand the level's nodes (one draft forward), take their top-k (or sampled) children."""
        shape = self.shape
        B, device = pending.shape[0], pending.device
        masks, drafted = _level_masks(shape, str(device))
        h_prev = drafter.root_features()  # [B, 1, H] outputs of the previous level's expanded nodes
        tok_prev = None
        level_tokens, level_logp = [], []
        draft_q = None
        for lv in shape.levels:
            if lv.depth > 0:
                slot = torch.tensor(lv.parent_slot, device=device)
                rank = torch.tensor(lv.rank, device=device)
                tokens = tok_prev[:, slot, rank]  # [B, E]
                h_prev = drafter.expand(h_prev[:, slot], tokens, lv.depth, masks[lv.depth - 1].expand(B, -1, -1))
            tok_prev, lp, q = drafter.children(h_prev, lv.topk)  # [B, E, topk]
            level_tokens.append(tok_prev)
            level_logp.append(lp)
            if q is not None:  # the expanded nodes' children were drawn from q [B, E, V]
                if draft_q is None:
                    draft_q = torch.zeros(B, shape.num_nodes, q.shape[-1], device=q.device)
                draft_q[:, list(lv.expanded)] = q
        tree = expand_static(shape, pending, level_tokens, level_logp, draft_q)
        if not drafted:  # the root's children only (a chain of 1): no drafted pair in the draft cache
            return tree, None
        node_slot = torch.full((B, shape.num_nodes), -1, dtype=torch.long, device=device)
        node_slot[:, list(drafted)] = torch.arange(len(drafted), device=device)
        return tree, node_slot


@functools.lru_cache(maxsize=64)
def _chain_layout(n: int, batch: int, device: str) -> tuple[Tensor, Tensor, Tensor]:
    """parents, depth (int64) and valid (bool) [batch, n] of chains of n nodes: the same every step, so built
    once (trees are never written in place)."""
    parents = torch.arange(-1, n - 1, device=device).expand(batch, n).contiguous()
    return parents, torch.arange(n, device=device).expand(batch, n).contiguous(), \
        torch.ones(batch, n, dtype=torch.bool, device=device)


@dataclass(frozen=True, init=False)
class Chain(StaticTree):
    """`depth` draft tokens in a row (top-1 at every step): the static tree of the one path [[0], [0, 0], ...]."""

    depth: int = 4

    kind: ClassVar[str] = "chain"
    options: ClassVar[tuple[str, ...]] = ("depth",)

    def __init__(self, depth: int = 4) -> None:
        object.__setattr__(self, "depth", _int_option("chain depth", depth))
        object.__setattr__(self, "paths", tuple((0,) * k for k in range(1, depth + 1)))

    def __repr__(self) -> str:
        return f"Chain({self.depth})"

    @classmethod
    def from_options(cls, depth: int | None = None, **given: object) -> Chain:
        cls._refuse_others(given)
        return cls(4 if depth is None else depth)

    @property
    def label(self) -> str:
        return f"chain{self.depth}"

    def draft(self, drafter: Drafter, pending: Tensor) -> tuple[DraftTree, Tensor | None]:
        """``StaticTree.draft`` of one path, without its per-level index assignments: node d + 1 is the top-1 (or
        sampled) child of node d, so the tree is the concatenation of the levels (~60 us less a step than the
        general assembly for a chain of 1 on a 2-core Xeon; tested equal to it)."""
        B, device, N = pending.shape[0], pending.device, self.depth + 1
        masks, drafted = _level_masks(self.shape, str(device))
        h = drafter.root_features()  # [B, 1, H]
        tokens, logp, qs = [pending[:, None]], [torch.zeros(B, 1, device=device)], []
        for d in range(self.depth):
            if d > 0:
                h = drafter.expand(h, tokens[-1], d, masks[d - 1].expand(B, -1, -1))  # [B, 1, H]
            tok, lp, q = drafter.children(h, 1)  # [B, 1, 1] each; q [B, 1, V] or None
            tokens.append(tok[:, :, 0])
            logp.append(lp[:, :, 0].to(torch.float32))
            qs.append(q)
        draft_q = None
        if qs[0] is not None:  # the leaf's children were never drawn: zeros, as the general assembly leaves them
            draft_q = torch.cat([*qs, qs[0].new_zeros(B, 1, qs[0].shape[-1])], dim=1)  # [B, N, V]
        parents, depth, valid = _chain_layout(N, B, str(device))
        tree = DraftTree(tokens=torch.cat(tokens, dim=1), parents=parents, depth=depth, valid=valid,
                         draft_logp=torch.cat(logp, dim=1), draft_q=draft_q, max_depth=self.depth, chain=True)
        if not drafted:  # a chain of 1: nothing drafted into the draft cache
            return tree, None
        # nodes 1 .. depth - 1 were expanded, in order: drafted slot j holds node j + 1's pair
        node_slot = torch.arange(-1, N - 1, device=device).expand(B, N).clone()
        node_slot[:, -1] = -1
        return tree, node_slot


@dataclass(frozen=True)
class DynamicTree(TreeStrategy):
    """EAGLE-2: expand the `topk` best nodes per level for `depth` levels, keep the `tree_tokens` best of all
    candidates (`tree.DynamicTreeBuilder`). Children are top-k only: the rerank may drop an earlier-sampled
    sibling while keeping a later one, which the sampled-children rule does not allow."""

    topk: int = 4
    depth: int = 5
    tree_tokens: int = 16

    kind: ClassVar[str] = "dynamic"
    options: ClassVar[tuple[str, ...]] = ("depth", "topk", "tree_tokens")
    samples_children: ClassVar[bool] = False

    def __post_init__(self) -> None:
        DynamicTreeBuilder(self.topk, self.depth, self.tree_tokens)  # validates

    @classmethod
    def from_options(cls, depth: int | None = None, topk: int | None = None, tree_tokens: int | None = None,
                     **given: object) -> DynamicTree:
        cls._refuse_others(given)
        return cls(topk=4 if topk is None else topk, depth=5 if depth is None else depth,
                   tree_tokens=16 if tree_tokens is None else tree_tokens)

    @property
    def num_nodes(self) -> int:
        return self.tree_tokens + 1

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def label(self) -> str:
        return f"dynamic{self.depth}x{self.topk}:{self.tree_tokens}"

    def draft(self, drafter: Drafter, pending: Tensor) -> tuple[DraftTree, Tensor]:
        builder = DynamicTreeBuilder(self.topk, self.depth, self.tree_tokens)
        B, device = pending.shape[0], pending.device
        frontier = builder.root(pending)
        h = drafter.root_features()  # [B, 1, H]
        drafted_ids = []  # builder candidate ids of the drafted (forwarded) frontiers, in slot order
        for level in range(self.depth):
            if level > 0:
                parent_h = h[torch.arange(B, device=device)[:, None], frontier.parent_slot]
                h = drafter.expand(parent_h, frontier.tokens, frontier.depth, frontier.mask[:, :, 1:])
                drafted_ids.append(frontier.ids)
            t, lp, _ = drafter.children(h, self.topk)  # [B, K, topk]
            frontier = builder.add_level(t, lp)
        tree = builder.build()
        node_slot = torch.full((B, tree.num_nodes), -1, dtype=torch.long, device=device)
        if drafted_ids:
            ids = torch.cat(drafted_ids, dim=1)  # [B, W]
            cand_slot = torch.full((B, builder.num_candidates + 1), -1, dtype=torch.long, device=device)
            cand_slot.scatter_(1, ids, torch.arange(ids.shape[1], device=device).expand(B, -1))
            node_slot = torch.where(tree.valid, cand_slot.gather(1, builder.kept_ids), -1)
        return tree, node_slot


@dataclass(frozen=True)
class NoDraft(TreeStrategy):
    """No speculation: the tree is the root alone and the target decodes one token. Vanilla decoding (no
    proposer) and a proposer pausing (large batches, or the dispatcher finding that no tree pays) both use it;
    the proposer still follows the committed tokens so it can draft again: it records each paused step's
    (feature, token) pair and encodes them in one catch-up forward when drafting resumes (`proposer.py`)."""

    kind: ClassVar[str] = "none"
    drafts: ClassVar[bool] = False

    @classmethod
    def from_options(cls, **given: object) -> NoDraft:
        cls._refuse_others(given)
        return cls()

    @property
    def num_nodes(self) -> int:
        return 1

    @property
    def max_depth(self) -> int:
        return 0

    @property
    def label(self) -> str:
        return "none"

    def draft(self, drafter: Drafter | None, pending: Tensor) -> tuple[DraftTree, None]:
        """Needs no drafter (None is fine)."""
        return DraftTree.root_only(pending), None


TREE_KINDS: dict[str, type[TreeStrategy]] = {c.kind: c for c in (Chain, StaticTree, DynamicTree, NoDraft)}


def tree_from_dict(d: Mapping) -> TreeStrategy:
    """{"kind": "chain", "depth": 3} / {"kind": "static", "paths": [[0], [1]]} / ... -> the strategy."""
    kind = d.get("kind")
    if kind not in TREE_KINDS:
        raise ValueError(f"tree kind must be one of {', '.join(map(repr, TREE_KINDS))}, got {kind!r}")
    cls = TREE_KINDS[kind]
    fields = {k: v for k, v in d.items() if k != "kind"}
    unknown = set(fields) - set(inspect.signature(cls).parameters)
    if unknown:
        raise ValueError(f"unknown keys for a {kind} tree: {sorted(unknown)}")
    return cls(**fields)


class TreeDispatcher:
    """Maps batch sizes to tree strategies.

    Built from (min_batch_size, strategy) entries sorted by strictly increasing min_batch_size, the first being
    1: an entry applies from its min_batch_size up to the next entry's minus one; the last applies above.
    """

    def __init__(self, entries: Sequence[tuple[int, TreeStrategy]] | Mapping[int, TreeStrategy]):
        if isinstance(entries, Mapping):
            entries = list(entries.items())
        if len(entries) == 0:
            raise ValueError("a tree dispatch table needs at least one entry")
        starts = []
        for start, cfg in entries:
            if isinstance(start, bool) or not isinstance(start, int) or start < 1:
                raise ValueError(f"batch-size bound {start!r} must be an int >= 1")
            if not isinstance(cfg, TreeStrategy):
                raise ValueError(f"entry {start}: expected a TreeStrategy, got {type(cfg).__name__}")
            if starts and start <= starts[-1]:
                raise ValueError(f"batch-size bounds must be strictly increasing, got {start} after {starts[-1]}")
            starts.append(start)
        if starts[0] != 1:
            raise ValueError(f"the first entry must start at batch size 1 (got {starts[0]}): "
                             f"every batch size >= 1 needs a tree")
        self.starts = tuple(starts)
        self.configs = tuple(cfg for _, cfg in entries)

    @classmethod
    def from_table(cls, table: Mapping | Sequence) -> TreeDispatcher:
        """From {min_batch: strategy} or [(min_batch, strategy), ...]; strategies as objects or dicts
        (`tree_from_dict`); keys may be digit strings (JSON). Order is validated, not fixed up."""
        items = list(table.items()) if isinstance(table, Mapping) else list(table)
        entries = []
        for item in items:
            if not isinstance(item, Sequence) or len(item) != 2:
                raise ValueError(f"dispatch entry {item!r} is not a (min_batch_size, strategy) pair")
            start, cfg = item
            if isinstance(start, str) and start.isdigit():
                start = int(start)
            if isinstance(cfg, Mapping):
                cfg = tree_from_dict(cfg)
            entries.append((start, cfg))
        return cls(entries)

    def pick(self, batch_size: int) -> TreeStrategy:
        """The strategy for `batch_size` (>= 1)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch size must be an int >= 1, got {batch_size!r}")
        return self.configs[bisect.bisect_right(self.starts, batch_size) - 1]

    def __repr__(self) -> str:
        return f"TreeDispatcher({list(zip(self.starts, self.configs))})"


# Measured on this project's 2-core CPU with the shipped SmolLM2-135M head (fp32, 2 threads; docs/results/HISTORY.md,
# docs/results/suite and default-tree): a target forward over 2 tokens costs the same as over 1 (cost curve
# 1.00), over 4 tokens 1.55x, and the head gets ~0.3 tokens accepted at depth 1 and ~0.08 at depth 2. So a
# single draft wins at batch 1: chain 1 1.10x vs chain 2 1.03x (40 MT-bench first turns, interleaved; chain 4
# 0.66x, dynamic 0.59x, EAGLE-1 static 0.55x on 16), and at batch 2-8 no tree beat vanilla (chain 1 0.96x at
# batch 4): from batch 2 on speculation pauses (`NoDraft`; the drafter keeps following, 2-5% cost). Re-measure
# with `eaglespec bench` (docs/BENCHMARKS.md) for other hardware or a stronger head.
DEFAULT_TREE_TABLE: dict[int, TreeStrategy] = {
    1: Chain(1),
    2: NoDraft(),
}
