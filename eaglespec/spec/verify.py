"""Tree verification: which drafted nodes the target accepts, and the bonus token after them.

Words used throughout (once, here):
- candidate: a child of the current node, tried in rank order (lower node index first); padding nodes
  (valid == False) are never candidates.
- accepted: a candidate the target keeps; verification then continues from it, with the target
  distribution at that node.
- residual: the target distribution p at the current node after the rejected candidates were taken out of
  it (speculative-sampling residual); the bonus token is drawn from it.
- bonus: the target's own token after the last accepted node (the next pending token): the argmax (greedy)
  or a sample of the residual (all candidates of the node rejected) or of p itself (the node has no
  candidates: a leaf). Committed tokens of a step = tokens of the accepted nodes + the bonus token.

Both verifiers walk all rows of the batch at once with tensor ops; the only Python loops run over tree
levels (greedy) or candidate tries (sampling), never over rows, and nothing reads a tensor back to the host
except, when `max_depth` is not given, one read of the tree's depth to size `Verdict.path`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.logits import argmax
from eaglespec.spec.sampling import sample_from_probs

if TYPE_CHECKING:
    from eaglespec.spec.tree import DraftTree

_TINY = torch.finfo(torch.float32).tiny


@dataclass
class Verdict:
    """Outcome of verifying one DraftTree per row."""

    path: torch.Tensor  # int64 [B, D+1]: accepted node indices, root (0) first, -1 padded
    n_accepted: torch.Tensor  # int64 [B]: accepted draft nodes (root excluded)
    bonus: torch.Tensor  # int64 [B]: next pending token (the target's token after the last accepted node)
    bonus_p: torch.Tensor | None = None
    """float32 [B]: the probability the bonus had in the distribution it was drawn from (sampling; 1 for greedy
    rows of a mixed batch); None from ``verify_greedy``. At a one-node (paused) step, p(bonus) under the
    target's distribution: what a look-back probe needs to score a sampled draft (``sampling.one_token_acceptance``)."""


def verify_greedy(tree: DraftTree, target_logits: torch.Tensor, *, max_depth: int | None = None) -> Verdict:
    """Greedy verification: target_logits [B, N, V] (logits or probabilities: only the argmax is used).

    From the root, follow the first valid child whose token equals the target argmax at the current node
    (first index on ties); stop when there is none. bonus = the argmax at the last accepted node. A one-node
    tree (vanilla decoding) gives n_accepted = 0 and bonus = argmax at the root.
    max_depth: the tree's maximum depth if the caller knows it (e.g. from the tree config): sizes `path`
    without reading the tree back to the host. Nodes deeper than max_depth are ignored, as if pruned (the
    verdict stays exact, it only accepts less).
    """
    B, N, _ = target_logits.shape
    width = _path_width(tree, max_depth)
    target = argmax(target_logits)  # [B, N] target token after each node
    if tree.chain and width == N:
        return _verify_chain_greedy(tree.tokens, target)
    path = _new_path(B, width, target.device)  # [B, D+1]
    cur = torch.zeros(B, dtype=torch.long, device=target.device)  # [B] current (last accepted) node
    alive = torch.ones(B, dtype=torch.bool, device=target.device)  # [B] still accepting
    node_ids = torch.arange(N, device=target.device)  # [N]
    for level in range(1, width):
        want = target.gather(1, cur[:, None])  # [B, 1]
        match = tree.valid & (tree.parents == cur[:, None]) & (tree.tokens == want)  # [B, N]
        child = torch.where(match, node_ids, N).amin(dim=-1)  # [B]; N = no match
        alive = alive & (child < N)
        cur = torch.where(alive, child, cur)
        path[:, level] = torch.where(alive, child, -1)
    n_accepted = (path[:, 1:] >= 0).sum(dim=-1)  # [B]
    bonus = target.gather(1, cur[:, None]).squeeze(1)  # [B]
    return Verdict(path=path, n_accepted=n_accepted, bonus=bonus)


def _verify_chain_greedy(tokens: torch.Tensor, target: torch.Tensor) -> Verdict:
    """``verify_greedy`` of chains (node i the parent of node i + 1, all valid): tokens, target [B, N]. Node i
    is accepted iff every node up to it matches the target's token after its parent, so the walk is one
    running product instead of a loop over levels (a chain of 1: 9 small ops instead of 17, ~40 us a step on a
    2-core Xeon)."""
    B, N = tokens.shape
    kept = (tokens[:, 1:] == target[:, :-1]).long().cumprod(dim=1)  # [B, N-1] 1 while the chain still matches
    n_accepted = kept.sum(dim=1)  # [B]
    node = torch.arange(1, N, device=tokens.device)  # [N-1]
    path = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=tokens.device),
                      torch.where(kept.bool(), node, -1)], dim=1)  # [B, N]
    bonus = target.gather(1, n_accepted[:, None]).squeeze(1)  # [B]: the target's token after node n_accepted
    return Verdict(path=path, n_accepted=n_accepted, bonus=bonus)


def verify_sampling(
    tree: DraftTree,
    target_probs: torch.Tensor,
    u_accept: torch.Tensor,
    u_sample: torch.Tensor,
    sampled_children: bool,
    *,
    max_depth: int | None = None,
) -> Verdict:
    """Lossless multi-round speculative sampling (EAGLE Algorithm 1 / SpecInfer) over a tree.

    target_probs [B, N, V]: the target distribution p after every node, AFTER temperature/top-k/top-p (the
    same `process_logits` vanilla decoding uses). u_accept [B, N]: the uniform for the acceptance test of
    each node (entry 0, the root, is unused); u_sample [B]: the uniform of the bonus draw.

    At the current node, with residual p (initially p at that node) and candidates x_1..x_m in rank order:
    - sampled_children=False (candidates chosen deterministically, e.g. draft top-k): accept x_i iff
      u < p(x_i); on rejection p(x_i) <- 0 and p is renormalised.
    - sampled_children=True (candidates drawn from q = tree.draft_q at the node, without replacement in rank
      order): accept x_i iff u < p(x_i) / q(x_i) (i.e. with min(1, p/q)); on rejection
      p <- normalise(max(0, p - q)) and q <- q with x_i removed, renormalised.
    After an acceptance the walk moves to the child with a fresh p (and q) at it. The bonus is a sample of
    the residual when every candidate was rejected, or of p at the last accepted node when it has none.
    A one-node tree (vanilla decoding) gives bonus = a sample of p at the root.

    Degenerate cases (no NaN, exact wherever the inputs are consistent):
    - q(x) == 0 for a sampled candidate: x cannot have come from q, so that round falls back to the
      deterministic rule (proposal = x itself), which is lossless for ANY candidate chosen independently of
      the uniforms. The same covers q exhausted by earlier siblings.
    - max(0, p - q) summing to 0 after a rejection (p == q up to rounding, where a rejection is itself a
      rounding event): the residual becomes p without x_i (the deterministic residual).
    - a token with p == 0 is never accepted (u < 0 is false) and never sampled (`sample_from_probs`).
    max_depth: as in `verify_greedy`.
    """
    B, N, _ = target_probs.shape
    if sampled_children and tree.draft_q is None:
        raise ValueError("sampled_children=True needs tree.draft_q (the distributions the children were drawn from)")
    width = _path_width(tree, max_depth)
    device = target_probs.device
    target_probs = target_probs.float()  # [B, N, V]
    draft_q = tree.draft_q.float() if sampled_children and N > 1 else None  # [B, N, V] or None
    if (N == 1 or (tree.chain and width == N)) and _chain_kernel_serves(target_probs, draft_q, u_accept, u_sample):
        # the same rule in one call (kernels/verify_chain.cpp): a chain of 1 at batch 1 288-439 -> 23-44 us, a
        # plain step 88 -> 26, batch 4 504-595 -> 202 (docs/results/epyc-2026-11-28-s21/verify_micro.txt)
        path, n_accepted, bonus, bonus_p = torch.ops.eaglespec.verify_chain_sampled(
            tree.tokens, target_probs, draft_q, u_accept.float(), u_sample.float(), width)
        return Verdict(path=path, n_accepted=n_accepted, bonus=bonus, bonus_p=bonus_p)
    if N == 1:  # a plain step (vanilla decoding, a paused batch): the bonus is a sample of p at the root
        return _bonus(target_probs[:, 0], u_sample, _new_path(B, width, device),
                      torch.zeros(B, dtype=torch.long, device=device))
    if tree.chain and width == N:
        return _verify_chain_sampling(tree.tokens, target_probs, draft_q, u_accept, u_sample)
    rows = torch.arange(B, device=device)  # [B]
    in_reach = tree.valid & (tree.depth < width)  # [B, N]; nodes deeper than max_depth count as pruned
    first_child, next_sibling = _candidate_links(tree.parents, in_reach)  # [B, N] each, N = none

    path = _new_path(B, width, device)  # [B, D+1]
    n_accepted = torch.zeros(B, dtype=torch.long, device=device)  # [B]
    p = target_probs[:, 0]  # [B, V] residual target at the current node
    q = draft_q[:, 0] if draft_q is not None else None  # [B, V] remaining draft distribution at the current node
    x_node = first_child[:, 0]  # [B] next candidate to try (N = none left: the walk has ended)

    # Each iteration every row tries its next candidate: after an acceptance the first child of the accepted
    # node, after a rejection the next sibling. A row tries each node at most once, so N - 1 iterations
    # finish every tree; rows with no candidate left keep their state.
    for _ in range(N - 1):
        has = x_node < N  # [B]
        x_node = x_node.clamp_max(N - 1)  # keep gathers in range; rows without candidate are masked below
        x = tree.tokens[rows, x_node]  # [B] candidate token
        accept, p_rejected, q_rejected = _try_candidate(p, q, x, u_accept[rows, x_node].float())
        accept = accept & has  # [B]
        reject = has & ~accept  # [B]

        p = torch.where(accept[:, None], target_probs[rows, x_node], torch.where(reject[:, None], p_rejected, p))
        if q is not None:
            q = torch.where(accept[:, None], draft_q[rows, x_node], torch.where(reject[:, None], q_rejected, q))
        n_accepted = n_accepted + accept.long()
        # the accepted node sits at depth n_accepted; other rows rewrite the root into column 0 (a no-op)
        col = torch.where(accept, n_accepted, 0)[:, None]  # [B, 1]
        path.scatter_(1, col, torch.where(accept, x_node, 0)[:, None])
        x_node = torch.where(
            accept, first_child[rows, x_node], torch.where(reject, next_sibling[rows, x_node], N)
        )

    return _bonus(p, u_sample, path, n_accepted)


def _chain_kernel_serves(p: torch.Tensor, q: torch.Tensor | None, u_accept: torch.Tensor, u_sample: torch.Tensor
                         ) -> bool:
    """Whether ``eaglespec::verify_chain_sampled`` takes this chain (or plain step): our CPU kernels are loaded
    (``cpu_kernels.serves``: packed models load them) and the inputs are float32 CPU tensors shaped as the
    kernel reads them (p [B, N, V], u_accept [B, N])."""
    tensors = (p, u_sample) if q is None else (p, q, u_sample)
    return p.shape[-1] > 0 and tuple(u_accept.shape) == tuple(p.shape[:2]) and cpu_kernels.serves(*tensors) \
        and u_accept.device == p.device


def _bonus(p: torch.Tensor, u: torch.Tensor, path: torch.Tensor, n_accepted: torch.Tensor) -> Verdict:
    """The verdict whose bonus is a sample of p [B, V] (need not be normalised) at uniforms u [B]."""
    bonus = sample_from_probs(p, u)  # [B]
    bonus_p = p.gather(1, bonus[:, None]).squeeze(1) / p.sum(dim=-1).clamp_min(_TINY)  # [B]
    return Verdict(path=path, n_accepted=n_accepted, bonus=bonus, bonus_p=bonus_p)


def _verify_chain_sampling(tokens: torch.Tensor, target_probs: torch.Tensor, draft_q: torch.Tensor | None,
                           u_accept: torch.Tensor, u_sample: torch.Tensor) -> Verdict:
    """``verify_sampling`` of chains (node i the parent of node i + 1, all valid): tokens [B, N], target_probs
    and draft_q [B, N, V]. Each node has one candidate, its child, so the walk's rounds are independent tests
    that read only p and q at the child's token: all taken at once (the same ratios, normalised as
    ``_try_candidate`` normalises them), a running product of acceptances gives each row's last accepted node,
    and only the rows' residual at that node is computed over the vocabulary, where the walk computes it at
    every node it visits (a chain of 1 at batch 1: 381-688 -> 264-471 us a step on a 2-core EPYC; a chain of 2
    648-1198 -> 259-462 us; docs/results/epyc-2026-11-27-s20/chain_verify_ab.txt). The same rule: tested
    against the walk and by the distribution oracle."""
    B, N, _ = target_probs.shape
    device = target_probs.device
    x = tokens[:, 1:, None]  # [B, N-1, 1] the candidate at node i: node i + 1's token
    p = target_probs[:, :-1]  # [B, N-1, V]
    p_x = p.gather(2, x).squeeze(2) / p.sum(dim=-1).clamp_min(_TINY)  # [B, N-1]
    if draft_q is not None:
        q = draft_q[:, :-1]  # [B, N-1, V]
        q_x = q.gather(2, x).squeeze(2) / q.sum(dim=-1).clamp_min(_TINY)  # [B, N-1]
        from_q = q_x > 0  # [B, N-1]; False: x cannot have come from q -> the deterministic rule
        ratio = torch.where(from_q, p_x / q_x.clamp_min(_TINY), p_x)  # [B, N-1]
    else:
        ratio = p_x
    kept = (u_accept[:, 1:].float() < ratio).long().cumprod(dim=1)  # [B, N-1] 1 while the chain is accepted
    n_accepted = kept.sum(dim=1)  # [B]: the node each row stops at
    node = torch.arange(1, N, device=device)  # [N-1]
    path = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=device),
                      torch.where(kept.bool(), node, -1)], dim=1)  # [B, N]
    at = torch.arange(B, device=device) * N + n_accepted  # [B] row of [B * N, V]: the node each row stops at
    p_end = target_probs.reshape(B * N, -1).index_select(0, at)  # [B, V]
    k = n_accepted.clamp(max=N - 2)[:, None]  # [B, 1] that node's candidate (whole chain accepted: unused)
    pn = p_end / p_end.sum(dim=-1, keepdim=True).clamp_min(_TINY)  # [B, V]
    p_rejected = pn.scatter(1, x.squeeze(2).gather(1, k), 0.0)  # [B, V] deterministic residual: p without it
    if draft_q is not None:
        qn = draft_q.reshape(B * N, -1).index_select(0, at)  # [B, V]
        qn = qn / qn.sum(dim=-1, keepdim=True).clamp_min(_TINY)
        residual = (pn - qn).clamp_min(0.0)  # [B, V]
        use_residual = from_q.gather(1, k).squeeze(1) & (residual.sum(dim=-1) > 0)  # [B]
        p_rejected = _rows_of(residual, p_rejected, use_residual)
    rejected = n_accepted < N - 1  # [B]: stopped at a rejected candidate, not at the leaf
    return _bonus(_rows_of(p_rejected, p_end, rejected), u_sample, path, n_accepted)


def _rows_of(a: torch.Tensor, b: torch.Tensor, take_a: torch.Tensor) -> torch.Tensor:
    """[B, V]: row i of a where take_a[i] (bool [B]), else of b; ``torch.where(take_a[:, None], a, b)`` as one
    row copy (torch's broadcast ``where`` takes ~27 us a row of 49152, the concatenation and row gather ~12)."""
    B = a.shape[0]
    rows = torch.arange(B, device=a.device)
    return torch.cat([a, b]).index_select(0, torch.where(take_a, rows, rows + B))


def _try_candidate(
    p: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One speculative-sampling round at a node.

    p [B, V] residual target, q [B, V] remaining draft distribution (None = deterministic candidates; both
    may be unnormalised), x [B] candidate tokens, u [B] uniforms.
    Returns accept [B], the residual p [B, V] and remaining q [B, V] (or None) to use if x is rejected.
    """
    p = p / p.sum(dim=-1, keepdim=True).clamp_min(_TINY)  # [B, V]
    p_x = p.gather(1, x[:, None]).squeeze(1)  # [B]
    p_without_x = p.scatter(1, x[:, None], 0.0)  # [B, V] deterministic residual: max(0, p - onehot(x))
    if q is None:
        return u < p_x, p_without_x, None
    q = q / q.sum(dim=-1, keepdim=True).clamp_min(_TINY)  # [B, V]
    q_x = q.gather(1, x[:, None]).squeeze(1)  # [B]
    from_q = q_x > 0  # [B]; False: x cannot have been drawn from q -> deterministic round
    ratio = torch.where(from_q, p_x / q_x.clamp_min(_TINY), p_x)  # [B]
    residual = (p - q).clamp_min(0.0)  # [B, V]
    use_residual = from_q & (residual.sum(dim=-1) > 0)  # [B]
    p_rejected = torch.where(use_residual[:, None], residual, p_without_x)  # [B, V]
    q_rejected = q.scatter(1, x[:, None], 0.0)  # [B, V] sampling without replacement: x leaves q
    return u < ratio, p_rejected, q_rejected


def _candidate_links(parents: torch.Tensor, candidate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-order links between candidate nodes: parents int64 [B, N], candidate bool [B, N] (nodes that may
    be tried) -> first_child [B, N] (lowest-index candidate child of each node) and next_sibling [B, N] (next
    higher-index candidate with the same parent); N where there is none."""
    B, N = parents.shape
    node_ids = torch.arange(N, device=parents.device)  # [N]
    is_child = candidate & (parents >= 0)  # [B, N]
    child_of = is_child[:, None, :] & (parents[:, None, :] == node_ids[None, :, None])  # [B, N(parent), N]
    first_child = torch.where(child_of, node_ids, N).amin(dim=-1)  # [B, N]
    later_sibling = is_child[:, None, :] & (parents[:, None, :] == parents[:, :, None]) & (node_ids > node_ids[:, None])
    next_sibling = torch.where(later_sibling, node_ids, N).amin(dim=-1)  # [B, N]
    return first_child, next_sibling


def _path_width(tree: DraftTree, max_depth: int | None) -> int:
    """D + 1 columns for Verdict.path; reads the tree's depth back to the host only if max_depth is None."""
    if max_depth is not None:
        if max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {max_depth}")
        return max_depth + 1
    if tree.depth.numel() == 0:
        return 1
    return int(tree.depth.masked_fill(~tree.valid, 0).max()) + 1  # the one host sync


def _new_path(B: int, width: int, device: torch.device) -> torch.Tensor:
    path = torch.full((B, width), -1, dtype=torch.long, device=device)  # [B, D+1]
    path[:, 0] = 0  # the root is always on the path
    return path
