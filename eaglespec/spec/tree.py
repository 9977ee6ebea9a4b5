"""Draft trees as data, and the pure functions around them.

Kept apart (the neural drafter lives elsewhere and only calls into this module):

* description: `DraftTree`, the one format every drafting strategy produces;
* buffer building (tree -> verification tensors): `tree_mask`, `tree_positions`, `leaf_paths`;
* selection (scores -> kept nodes): static shapes (`TreeShape`, `static_shape`, `expand_static`) and the
  EAGLE-2 dynamic tree (`DynamicTreeBuilder`).

The kinds of tree built from these pieces (chain, static, dynamic, none) and which one runs at a batch size
live in `strategies.py`.

Shapes: B = batch rows, N = tree nodes (node 0 = root = the row's pending token), V = vocabulary,
D = max node depth, L = max leaves per row, C = max children per node.

Functions meant to run once per decoding step use tensor ops only (Python loops only over depth levels or
over log2(N) pointer-jumping rounds) and never read tensor values on the host, except where an output shape
depends on the data (`leaf_paths` without its size hints), which is documented there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = [
    "DraftTree",
    "tree_mask",
    "tree_positions",
    "leaf_paths",
    "StaticLevel",
    "TreeShape",
    "static_shape",
    "EAGLE1_TREE_PATHS",
    "expand_static",
    "Frontier",
    "DynamicTreeBuilder",
]


# --------------------------------------------------------------------------------------------------------
# Description
# --------------------------------------------------------------------------------------------------------


_ROOT_FIELDS: dict[tuple[int, torch.device], tuple[Tensor, Tensor, Tensor, Tensor]] = {}


def _root_fields(batch: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """parents (-1), depth (0), valid (True) and draft_logp (0) of ``batch`` one-node trees, made once per batch
    size and device and shared by every ``DraftTree.root_only`` (read-only: nothing writes a tree's fields).
    Every plain step drafts one, and its four small tensors took ~10 us to make in isolation, several times that
    between the target's forwards (cold caches), in vanilla and paused steps alike."""
    key = (batch, device)
    fields = _ROOT_FIELDS.get(key)
    if fields is None:
        with torch.inference_mode(False):  # plain tensors: usable outside inference mode too
            zeros = torch.zeros(batch, 1, dtype=torch.int64, device=device)
            fields = _ROOT_FIELDS[key] = (zeros - 1, zeros, torch.ones(batch, 1, dtype=torch.bool, device=device),
                                          torch.zeros(batch, 1, dtype=torch.float32, device=device))
    return fields


@dataclass
class DraftTree:
    """A batch of draft trees, one per row. Node 0 is the root (the row's pending token)."""

    tokens: Tensor  # int64 [B, N]
    parents: Tensor  # int64 [B, N]; parent index < own index; -1 for the root and for padding nodes
    depth: Tensor  # int64 [B, N]; root 0
    valid: Tensor  # bool [B, N]; False for padding nodes
    draft_logp: Tensor  # float32 [B, N]; log q(token | parent) under the draft; 0 for the root
    draft_q: Tensor | None = None  # float32 [B, N, V]: distribution each node's children were SAMPLED from
    max_depth: int | None = None  # host-side upper bound of `depth` known from the tree's shape (None = unknown):
    # lets verification size its outputs without reading the tree back
    chain: bool = False  # known from the shape: every row is one path, node i the parent of node i + 1 (all
    # valid), so its ancestor mask is causal and a forward needs no block mask (``tree_mask`` of it is tril)

    @property
    def num_nodes(self) -> int:
        """N, the node count of every row (padding included)."""
        return self.tokens.shape[1]

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @classmethod
    def root_only(cls, tokens: Tensor) -> DraftTree:
        """The trivial tree of vanilla decoding: just the pending tokens, int64 [B] or [B, 1] -> N = 1."""
        tokens = tokens.reshape(-1, 1).to(torch.int64)  # [B, 1]
        parents, depth, valid, logp = _root_fields(tokens.shape[0], tokens.device)
        return cls(tokens=tokens, parents=parents, depth=depth, valid=valid, draft_logp=logp, max_depth=0)

    def select(self, rows: Tensor) -> DraftTree:
        """The sub-batch of the given rows (int64 [b] indices into the batch), same N."""
        return DraftTree(**{name: t.index_select(0, rows) if isinstance(t, Tensor) else t
                            for name, t in vars(self).items()})

    def validate(self) -> None:
        """Check the structural invariants; raise ValueError naming the first offending row and node.

        A debugging / test helper (it reads tensors on the host): shapes and dtypes agree; the root is valid,
        has parent -1, depth 0 and draft_logp 0; every other valid node has a valid parent with a smaller index
        and depth = parent depth + 1; padding nodes have parent -1 and no valid node hangs below them.
        """
        B, N = self.tokens.shape
        if N < 1:
            raise ValueError("a DraftTree needs at least the root node")
        for name in ("parents", "depth", "valid", "draft_logp"):
            t = getattr(self, name)
            if tuple(t.shape) != (B, N):
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {(B, N)}")
        for name, dtype in (("tokens", torch.int64), ("parents", torch.int64), ("depth", torch.int64),
                            ("valid", torch.bool)):
            if getattr(self, name).dtype != dtype:
                raise ValueError(f"{name} has dtype {getattr(self, name).dtype}, expected {dtype}")
        if not self.draft_logp.is_floating_point():
            raise ValueError(f"draft_logp must be floating point, got {self.draft_logp.dtype}")
        if self.draft_q is not None and (self.draft_q.dim() != 3 or tuple(self.draft_q.shape[:2]) != (B, N)):
            raise ValueError(f"draft_q has shape {tuple(self.draft_q.shape)}, expected ({B}, {N}, V)")

        parents, depth, valid = self.parents.tolist(), self.depth.tolist(), self.valid.tolist()
        root_logp = self.draft_logp[:, 0].tolist()
        for b in range(B):
            par, dep, val = parents[b], depth[b], valid[b]
            if not val[0] or par[0] != -1 or dep[0] != 0 or root_logp[b] != 0:
                raise ValueError(f"row {b}: the root must be valid with parent -1, depth 0 and draft_logp 0")
            for i in range(1, N):
                p = par[i]
                if not val[i]:
                    if p != -1:
                        raise ValueError(f"row {b}, node {i}: padding node has parent {p}, expected -1")
                    continue
                if not 0 <= p < i:
                    raise ValueError(f"row {b}, node {i}: parent {p} is not an earlier node")
                if not val[p]:
                    raise ValueError(f"row {b}, node {i}: parent {p} is a padding node")
                if dep[i] != dep[p] + 1:
                    raise ValueError(f"row {b}, node {i}: depth {dep[i]} != parent depth {dep[p]} + 1")


# --------------------------------------------------------------------------------------------------------
# Buffer building: tree -> verification tensors
# --------------------------------------------------------------------------------------------------------


def tree_mask(parents: Tensor, valid: Tensor) -> Tensor:
    """Ancestor-or-self mask: out[b, i, j] is True iff node j is node i or an ancestor of node i.

    parents: int64 [B, N], valid: bool [B, N] -> bool [B, N, N]. A padding node sees only itself.
    Pointer jumping: after round k, `reach` holds the ancestors at distance < 2^k, and `jump` the ancestor at
    distance exactly 2^k (-1 if none); ceil(log2(N)) rounds cover every depth.
    """
    B, N = parents.shape
    par = torch.where(valid & (parents >= 0), parents, -1)  # [B, N]; padding and root have no parent
    reach = torch.eye(N, dtype=torch.bool, device=parents.device).expand(B, N, N).clone()  # [B, N, N]
    jump = par  # [B, N]
    for _ in range((N - 1).bit_length()):  # 2^rounds > N - 1 >= any depth
        has = jump >= 0  # [B, N]
        j = jump.clamp(min=0)
        reach_j = reach.gather(1, j[:, :, None].expand(B, N, N))  # [B, N, N]: row jump[i] of reach
        reach = reach | (reach_j & has[:, :, None])
        jump = torch.where(has, jump.gather(1, j), -1)
    return reach


def tree_positions(depth: Tensor, prefix_lengths: Tensor) -> Tensor:
    """Rotary positions of the nodes: prefix length of the row + node depth.

    depth: int64 [B, N], prefix_lengths: int64 [B] (committed tokens, i.e. the root's position) -> int64 [B, N].
    """
    return prefix_lengths.to(torch.int64)[:, None] + depth


def _is_leaf(parents: Tensor, valid: Tensor) -> Tensor:
    """bool [B, N]: valid nodes without valid children."""
    B, N = parents.shape
    is_child = valid & (parents >= 0)  # [B, N]
    n_children = torch.zeros(B, N + 1, dtype=torch.int64, device=parents.device)
    n_children.scatter_add_(1, torch.where(is_child, parents, N), torch.ones_like(parents))  # slot N = dump
    return valid & (n_children[:, :N] == 0)


def leaf_paths(parents: Tensor, valid: Tensor, *, max_leaves: int | None = None,
               max_depth: int | None = None) -> Tensor:
    """Root-to-leaf node index paths: int64 [B, L, D+1], -1 padded.

    parents: int64 [B, N], valid: bool [B, N]. out[b, l, d] is the node at depth d on the path to the l-th
    leaf of row b (leaves in node order), -1 past the leaf's depth or for l >= the row's leaf count.
    L and D depend on the data: by default they are the exact maxima over the batch, which costs one host
    sync. Pass `max_leaves` / `max_depth` (upper bounds, e.g. from the tree configuration) to keep shapes
    static and avoid the sync; they must not be smaller than the true values (not checked, for that reason).
    """
    B, N = parents.shape
    mask = tree_mask(parents, valid)  # [B, N, N]
    depth = mask.sum(-1) - 1  # [B, N]: number of strict ancestors
    is_leaf = _is_leaf(parents, valid)  # [B, N]
    if max_leaves is None or max_depth is None:
        n_leaves, deepest = torch.stack([is_leaf.sum(1).max(), depth.max()]).tolist()
        max_leaves = n_leaves if max_leaves is None else max_leaves
        max_depth = deepest if max_depth is None else max_depth
    D1 = max_depth + 1

    # by_depth[b, i, d] = ancestor-or-self of node i at depth d (column D1 is a dump for non-ancestors)
    by_depth = torch.full((B, N, D1 + 1), -1, dtype=torch.int64, device=parents.device)
    col = torch.where(mask, depth[:, None, :].clamp(max=D1), D1)  # [B, N, N]
    src = torch.arange(N, device=parents.device).expand(B, N, N)
    by_depth.scatter_(2, col, src)
    by_depth = by_depth[:, :, :D1]

    leaf_order = torch.sort((~is_leaf).to(torch.int8), dim=1, stable=True).indices  # leaves first, node order
    L = max_leaves
    if L > N:
        leaf_order = torch.cat([leaf_order, leaf_order.new_zeros(B, L - N)], dim=1)
    leaf_order = leaf_order[:, :L]  # [B, L]
    paths = by_depth.gather(1, leaf_order[:, :, None].expand(B, L, D1))  # [B, L, D+1]
    has_leaf = torch.arange(L, device=parents.device)[None, :] < is_leaf.sum(1, keepdim=True)  # [B, L]
    return torch.where(has_leaf[:, :, None], paths, -1)


# --------------------------------------------------------------------------------------------------------
# Static shapes (EAGLE-1 trees; a chain is the shape of one path)
# --------------------------------------------------------------------------------------------------------


# The EAGLE-1 reference tree (`mc_sim_7b_63` in the EAGLE repository's `eagle/model/choices.py`): 25 top-k
# rank paths, 26 nodes with the root.
EAGLE1_TREE_PATHS: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)


@dataclass(frozen=True)
class StaticLevel:
    """Drafting step `depth` of a static shape: expand the nodes at `depth` into their children at depth+1.

    The drafter runs the draft model on `expanded` (in this order; E = len(expanded)), takes the top-`topk`
    tokens of each, and hands them to `expand_static` as a [B, E, >= topk] tensor.
    """

    depth: int
    expanded: tuple[int, ...]  # node indices at `depth` that have children, in node order
    parent_slot: tuple[int, ...]  # per expanded node: index of its parent in the previous level's `expanded`
    # (-1 at depth 0): where the drafter finds the parent's output feature
    rank: tuple[int, ...]  # per expanded node: its rank under its parent (-1 at depth 0): with parent_slot,
    # where its token sits in the previous level's top-k grid
    topk: int  # top-k tokens needed per expanded node (max child rank + 1)
    children: tuple[int, ...]  # node indices at depth+1, in node order
    child_slot: tuple[int, ...]  # per child: index of its parent in `expanded`
    child_rank: tuple[int, ...]  # per child: its rank (which top-k token of its parent)


@dataclass(frozen=True)
class TreeShape:
    """A static tree compiled from top-k rank paths. Nodes are ordered by depth, then parent, then rank.

    Per node (N = 1 + number of paths): `paths[i]` (() for the root), `parents[i]` (-1 for the root),
    `ranks[i]` (-1 for the root), `depths[i]`. `levels[d]` describes drafting step d (d = 0 .. max_depth-1).
    """

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    depths: tuple[int, ...]
    levels: tuple[StaticLevel, ...]
    _index_cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return len(self.levels)

    @property
    def is_chain(self) -> bool:
        """One path: node i is the parent of node i + 1."""
        return self.parents == tuple(range(-1, self.num_nodes - 1))

    @property
    def depth_counts(self) -> tuple[int, ...]:
        """Nodes per depth, root included: e.g. (1, 4, 8, 8, 3, 2) for EAGLE1_TREE_PATHS."""
        return tuple(self.depths.count(d) for d in range(self.max_depth + 1))

    @property
    def max_leaves(self) -> int:
        has_child = set(self.parents)
        return sum(1 for i in range(self.num_nodes) if i not in has_child)

    @property
    def max_children(self) -> int:
        return max(self.parents.count(i) for i in range(self.num_nodes))

    def parents_tensor(self, device: torch.device | str | None = None) -> Tensor:
        """int64 [N] parent indices, e.g. for `tree_mask(shape.parents_tensor()[None], ...)`."""
        return self._indices(device)["parents"]

    def _indices(self, device: torch.device | str | None) -> dict[str, Tensor]:
        """Index tensors for `expand_static`, built once per device."""
        key = str(torch.device(device) if device is not None else torch.device("cpu"))
        if key not in self._index_cache:
            def t(values: Sequence[int]) -> Tensor:
                return torch.tensor(values, dtype=torch.int64, device=device)
            entry = {"parents": t(self.parents), "depths": t(self.depths)}
            for lv in self.levels:
                entry[f"children{lv.depth}"] = t(lv.children)
                entry[f"slot{lv.depth}"] = t(lv.child_slot)
                entry[f"rank{lv.depth}"] = t(lv.child_rank)
            self._index_cache[key] = entry
        return self._index_cache[key]


def static_shape(paths: Sequence[Sequence[int]]) -> TreeShape:
    """Validate and compile top-k rank paths (e.g. [[0], [1], [0, 0]]) into a `TreeShape`.

    Raises ValueError for: no paths, an empty path, a rank that is not a non-negative int, a duplicate path,
    or a path whose prefix is missing.
    """
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence) or len(paths) == 0:
        raise ValueError("a static tree needs a non-empty list of top-k rank paths")
    seen: set[tuple[int, ...]] = set()
    for p in paths:
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or len(p) == 0:
            raise ValueError(f"tree path {p!r} must be a non-empty list of top-k ranks")
        for r in p:
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                raise ValueError(f"tree path {list(p)}: rank {r!r} is not a non-negative int")
        tp = tuple(p)
        if tp in seen:
            raise ValueError(f"tree path {list(tp)} appears twice")
        seen.add(tp)
    for tp in seen:
        for k in range(1, len(tp)):
            if tp[:k] not in seen:
                raise ValueError(f"tree path {list(tp)}: its prefix {list(tp[:k])} is missing")

    # depth, then lexicographic: within a level this is (parent's node index, rank), since parents are
    # themselves ordered that way one level up
    ordered = [()] + sorted(seen, key=lambda tp: (len(tp), tp))
    index = {tp: i for i, tp in enumerate(ordered)}
    parents = tuple(-1 if not tp else index[tp[:-1]] for tp in ordered)
    ranks = tuple(-1 if not tp else tp[-1] for tp in ordered)
    depths = tuple(len(tp) for tp in ordered)

    levels = []
    max_depth = max(depths)
    prev_expanded: tuple[int, ...] = ()
    for d in range(max_depth):
        children = tuple(i for i in range(len(ordered)) if depths[i] == d + 1)
        expanded = tuple(sorted({parents[c] for c in children}))
        levels.append(StaticLevel(
            depth=d,
            expanded=expanded,
            parent_slot=tuple(prev_expanded.index(parents[e]) if d > 0 else -1 for e in expanded),
            rank=tuple(ranks[e] for e in expanded),
            topk=max(ranks[c] for c in children) + 1,
            children=children,
            child_slot=tuple(expanded.index(parents[c]) for c in children),
            child_rank=tuple(ranks[c] for c in children),
        ))
        prev_expanded = expanded
    return TreeShape(paths=tuple(ordered), parents=parents, ranks=ranks, depths=depths, levels=tuple(levels))


def expand_static(shape: TreeShape, root_tokens: Tensor, level_tokens: Sequence[Tensor],
                  level_logp: Sequence[Tensor], draft_q: Tensor | None = None) -> DraftTree:
    """Assemble the `DraftTree` of a static shape from the drafter's per-level top-k results.

    root_tokens: int64 [B], the pending tokens.
    level_tokens[d], level_logp[d] (d = 0 .. shape.max_depth-1): int64 / float [B, E_d, K] with
        E_d = len(shape.levels[d].expanded) and K >= shape.levels[d].topk: entry [b, e, r] is the r-th best
        draft token (and its log-prob) of node shape.levels[d].expanded[e]; ranks beyond `topk` are ignored.
    draft_q: optional float32 [B, N, V], passed through (only for children SAMPLED rather than top-k).
    Returns a DraftTree with N = shape.num_nodes nodes, all valid. One gather per level, no host sync.
    """
    if len(level_tokens) != shape.max_depth or len(level_logp) != shape.max_depth:
        raise ValueError(f"expected {shape.max_depth} levels of top-k results, got {len(level_tokens)} token "
                         f"and {len(level_logp)} log-prob tensors")
    B, N, device = root_tokens.shape[0], shape.num_nodes, root_tokens.device
    idx = shape._indices(device)
    tokens = torch.zeros(B, N, dtype=torch.int64, device=device)
    logp = torch.zeros(B, N, dtype=torch.float32, device=device)
    tokens[:, 0] = root_tokens
    for lv, tok, lp in zip(shape.levels, level_tokens, level_logp):
        E = len(lv.expanded)
        for name, t in (("tokens", tok), ("logp", lp)):
            if t.dim() != 3 or t.shape[0] != B or t.shape[1] != E or t.shape[2] < lv.topk:
                raise ValueError(f"level {lv.depth} {name}: shape {tuple(t.shape)}, expected "
                                 f"({B}, {E}, >={lv.topk})")
        slot, rank, children = idx[f"slot{lv.depth}"], idx[f"rank{lv.depth}"], idx[f"children{lv.depth}"]
        tokens[:, children] = tok[:, slot, rank]  # [B, children of this level]
        logp[:, children] = lp[:, slot, rank].to(torch.float32)
    return DraftTree(
        tokens=tokens,
        parents=idx["parents"].expand(B, N).clone(),
        depth=idx["depths"].expand(B, N).clone(),
        valid=torch.ones(B, N, dtype=torch.bool, device=device),
        draft_logp=logp,
        draft_q=draft_q,
        max_depth=shape.max_depth,
        chain=shape.is_chain,
    )


# --------------------------------------------------------------------------------------------------------
# Dynamic tree (EAGLE-2): expand the best frontier per level, then rerank all candidates
# --------------------------------------------------------------------------------------------------------


@dataclass
class Frontier:
    """The K nodes the drafter expands next (K = 1 for the root, `topk` afterwards).

    Processed nodes are the root then every returned frontier, in order: S = 1 + K_1 + ... + K_l. The drafter
    appends this frontier's draft K/V after the previously processed nodes.
    """

    tokens: Tensor  # int64 [B, K]: draft input tokens of this step
    scores: Tensor  # float32 [B, K]: cumulative path log-prob
    parent_slot: Tensor  # int64 [B, K]: index of each node's parent in the previous frontier (-1 for the root)
    mask: Tensor  # bool [B, K, S]: which processed nodes (self included) each frontier node attends to
    ids: Tensor  # int64 [B, K]: candidate ids inside the builder (creation order; root = 0)
    depth: int  # depth of these nodes (their draft positions are prefix length + depth)


class DynamicTreeBuilder:
    """EAGLE-2 dynamic tree selection, as tensor ops on the drafter's top-k results.

    Protocol, per decoding step:
        frontier = builder.root(root_tokens)             # root_tokens int64 [B]; frontier K = 1
        for _ in range(depth):
            # draft forward on frontier.tokens -> top-k per node
            frontier = builder.add_level(child_tokens, child_logp)   # [B, K, topk] each
        tree = builder.build()                           # DraftTree, N = tree_tokens + 1

    Scoring: child score = parent score + child logp (logp clamped to <= 0 so a child never outscores its
    parent). Expansion: the next frontier is the `topk` best children of the level. Rerank: of ALL candidates
    (every level, expanded or not) keep the `tree_tokens` best in the order (score desc, creation index asc);
    creation is level by level, so ties go to the shallower node and a parent always precedes its children:
    the kept set is a connected tree. Candidates with score -inf (pass logp = -inf to forbid a child) are
    never kept: if fewer than `tree_tokens` remain, the row is padded with invalid nodes at the end.
    Output nodes are ordered by depth, then score (so siblings are in descending draft log-prob).
    NaN log-probs are not supported.
    """

    def __init__(self, topk: int, depth: int, tree_tokens: int):
        for name, v in (("topk", topk), ("depth", depth), ("tree_tokens", tree_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if tree_tokens > self.candidates_for(topk, depth):
            raise ValueError(f"tree_tokens={tree_tokens} exceeds the {self.candidates_for(topk, depth)} "
                             f"candidates that topk={topk}, depth={depth} generate")
        self.topk, self.depth, self.tree_tokens = topk, depth, tree_tokens
        self._levels: list[dict[str, Tensor]] = []
        self._frontier: Frontier | None = None

    @staticmethod
    def candidates_for(topk: int, depth: int) -> int:
        """Candidates generated (root excluded): topk at level 1, topk * topk at each later level."""
        return topk + (depth - 1) * topk * topk

    @property
    def num_nodes(self) -> int:
        return self.tree_tokens + 1

    def root(self, root_tokens: Tensor) -> Frontier:
        """Start a new tree (forgets any previous one). root_tokens: int64 [B]. Returns the root frontier."""
        B, device = root_tokens.shape[0], root_tokens.device
        tokens = root_tokens.to(torch.int64)[:, None]  # [B, 1]
        zeros_f = torch.zeros(B, 1, dtype=torch.float32, device=device)
        self._levels = [{
            "tokens": tokens,
            "logp": zeros_f,
            "score": zeros_f,
            "parent": torch.full((B, 1), -1, dtype=torch.int64, device=device),  # candidate id of the parent
        }]
        self._frontier = Frontier(
            tokens=tokens, scores=zeros_f, parent_slot=torch.full((B, 1), -1, dtype=torch.int64, device=device),
            mask=torch.ones(B, 1, 1, dtype=torch.bool, device=device),
            ids=torch.zeros(B, 1, dtype=torch.int64, device=device), depth=0,
        )
        return self._frontier

    def add_level(self, child_tokens: Tensor, child_logp: Tensor) -> Frontier:
        """Record the top-k children of the current frontier and return the next frontier.

        child_tokens: int64 [B, K, topk], child_logp: float [B, K, topk], where K is the current frontier's
        size and [b, k, r] is the r-th child (token, draft log-prob) of frontier node k of row b.
        Returns the `topk` best of these K * topk children (by score; ties to the earlier one).
        """
        front = self._frontier
        if front is None:
            raise RuntimeError("call root() before add_level()")
        if len(self._levels) > self.depth:
            raise RuntimeError(f"all {self.depth} levels were already added")
        B, K = front.tokens.shape
        for name, t in (("child_tokens", child_tokens), ("child_logp", child_logp)):
            if tuple(t.shape) != (B, K, self.topk):
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {(B, K, self.topk)}")
        offset = sum(lv["tokens"].shape[1] for lv in self._levels)  # first candidate id of this level
        M = K * self.topk
        logp = child_logp.to(torch.float32).reshape(B, M)
        score = (front.scores[:, :, None] + child_logp.to(torch.float32).clamp(max=0)).reshape(B, M)
        self._levels.append({
            "tokens": child_tokens.to(torch.int64).reshape(B, M),
            "logp": logp,
            "score": score,
            "parent": front.ids[:, :, None].expand(B, K, self.topk).reshape(B, M),
        })

        pick = torch.sort(score, dim=1, descending=True, stable=True).indices[:, : self.topk]  # [B, topk]
        parent_slot = pick // self.topk
        S = front.mask.shape[2]
        ancestors = front.mask.gather(1, parent_slot[:, :, None].expand(B, self.topk, S))  # parent rows
        own = torch.eye(self.topk, dtype=torch.bool, device=score.device).expand(B, self.topk, self.topk)
        self._frontier = Frontier(
            tokens=self._levels[-1]["tokens"].gather(1, pick),
            scores=score.gather(1, pick),
            parent_slot=parent_slot,
            mask=torch.cat([ancestors, own], dim=2),
            ids=offset + pick,
            depth=front.depth + 1,
        )
        return self._frontier

    def build(self) -> DraftTree:
        """Rerank all candidates and return the DraftTree (N = tree_tokens + 1; draft_q None: top-k children)."""
        if len(self._levels) != self.depth + 1:
            raise RuntimeError(f"build() needs root() and {self.depth} add_level() calls, "
                               f"got {len(self._levels) - 1} levels")
        cat = {k: torch.cat([lv[k] for lv in self._levels], dim=1) for k in self._levels[0]}  # [B, M+1]
        B, device, T = cat["tokens"].shape[0], cat["tokens"].device, self.tree_tokens
        depth_all = torch.cat([torch.full((lv["tokens"].shape[1],), d, dtype=torch.int64, device=device)
                               for d, lv in enumerate(self._levels)])  # [M+1]

        # selection: stable sort keeps creation order among equal scores (parents before children)
        kept = torch.sort(cat["score"][:, 1:], dim=1, descending=True, stable=True).indices[:, :T] + 1  # [B, T]
        kept_valid = cat["score"].gather(1, kept) > float("-inf")  # [B, T]
        # output order: depth, then selection rank; padding last
        kept_depth = torch.where(kept_valid, depth_all[kept], self.depth + 1)
        order = torch.argsort(kept_depth * T + torch.arange(T, device=device), dim=1)
        kept, kept_valid = kept.gather(1, order), kept_valid.gather(1, order)

        nodes = torch.cat([torch.zeros(B, 1, dtype=torch.int64, device=device), kept], dim=1)  # [B, N] cand ids
        # For drafters that reuse per-candidate state (e.g. draft K/V of expanded nodes): node -> candidate id.
        self.kept_ids, self.num_candidates = nodes, cat["tokens"].shape[1] - 1
        valid = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=device), kept_valid], dim=1)
        N = T + 1
        new_index = torch.full_like(cat["tokens"], -1)  # [B, M+1]: candidate id -> node index
        new_index.scatter_(1, nodes, torch.arange(N, device=device).expand(B, N))
        parent_cand = cat["parent"].gather(1, nodes)  # [B, N]
        parents = new_index.gather(1, parent_cand.clamp(min=0))
        has_parent = valid & (parent_cand >= 0)
        return DraftTree(
            tokens=torch.where(valid, cat["tokens"].gather(1, nodes), 0),
            parents=torch.where(has_parent, parents, -1),
            depth=torch.where(valid, depth_all[nodes], 0),
            valid=valid,
            draft_logp=torch.where(valid, cat["logp"].gather(1, nodes), 0.0),
            draft_q=None,
            max_depth=self.depth,
        )
