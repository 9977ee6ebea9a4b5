"""Logits processing (temperature -> top-k -> top-p) and inverse-CDF sampling: pure tensor functions.

Vanilla decoding and speculative verification both call `process_logits` on the target logits, so
speculation samples from exactly the distribution vanilla decoding would. Randomness enters only through
uniforms passed in by the caller (`draw_uniforms`: generators of each sequence's own), which makes every function
here deterministic and lets a sequence's tokens depend on its own seed alone, whatever batch it runs in.
"""

from __future__ import annotations

from typing import Sequence

import torch

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.logits import argmax


def process_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Target logits [..., V] -> sampling distribution probs [..., V] (float32, rows sum to 1).

    Order: temperature scaling, then top-k, then top-p, then renormalisation.
    - temperature == 0 means greedy: a one-hot of the argmax (first index on ties). top-k/top-p cannot change
      it (the argmax survives both filters), so greedy and "sampling at T=0" agree token for token.
    - top_k (0 = off, >= V = off): keeps every token whose scaled logit is >= the k-th largest, so tokens tied
      with the k-th are all kept (the result never depends on how ties are ordered).
    - top_p (1.0 = off): nucleus; keeps the smallest set of most likely tokens whose mass is >= top_p (of the
      distribution after top-k). The most likely token is always kept. Among tokens of equal probability at
      the boundary the lower token id comes first.
    Works on any leading shape ([B, V], [B, N, V], ...). Rows whose logits are all -inf are invalid input.
    The parameters are taken as valid: `config.SamplingParams` refuses bad ones where they enter.
    """
    logits = logits.float()  # [..., V]
    V = logits.shape[-1]
    if temperature == 0:
        top = argmax(logits)[..., None]  # [..., 1]
        return torch.zeros_like(logits).scatter_(-1, top, 1.0)
    if temperature < 1e-2:
        # 1 / temperature can overflow float32 (or temperature underflow to 0): shift the maximum to 0 first and
        # divide by at least float32's smallest normal, so the top token stays finite and the others go to -inf.
        logits = (logits - logits.amax(dim=-1, keepdim=True)) / max(temperature, torch.finfo(torch.float32).tiny)
    else:
        logits = logits / temperature
    if 0 < top_k < V:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # [..., 1], the k-th largest scaled logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # [..., V]
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # [..., V] each
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # [..., V] mass of the strictly more likely tokens
        drop_sorted = mass_before >= top_p  # [..., V]
        drop_sorted[..., 0] = False  # the most likely token is always kept (a top_p below float32's range is 0)
        drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)  # back to vocabulary order
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs [B, V] (non-negative, need not be normalised), u [B] in [0, 1) -> int64 [B].

    Returns, per row, the first token whose cumulative mass exceeds u * total mass. Deterministic given u.
    A token with probability 0 is never returned: only positive-probability tokens are candidates, and a u
    at (or rounding up to) the top of the CDF falls back to the last positive-probability token. Rows with
    no positive entry are invalid input (token 0 comes back). Where our CPU kernels are loaded (packed
    models), ``eaglespec::sample_rows`` draws it in one pass (~210 -> ~15 us a row of 49152): the same rule,
    its cumulative sums added in another fixed order, so a u within rounding of a boundary may draw the
    neighbouring token (vanilla and speculative decoding in one process draw alike).
    """
    probs, u = probs.float(), u.float()  # [B, V], [B]
    V = probs.shape[-1]
    if V > 0 and cpu_kernels.serves(probs, u):  # the same draw in one pass (``kernels/select.cpp``)
        return torch.ops.eaglespec.sample_rows(probs.detach(), u.detach())
    cdf = probs.cumsum(dim=-1)  # [B, V]
    target = u[:, None] * cdf[:, -1:]  # [B, 1]
    positive = probs > 0  # [B, V]
    hit = positive & (cdf > target)  # [B, V]; cdf need not be exactly monotone after a parallel scan
    ids = torch.arange(V, device=probs.device).expand_as(probs)  # [B, V]
    first_hit = torch.where(hit, ids, V).amin(dim=-1)  # [B]; V where nothing hit (u -> 1 rounding)
    last_positive = torch.where(positive, ids, -1).amax(dim=-1).clamp_min(0)  # [B]
    return torch.where(first_hit < V, first_hit, last_positive)


def draw_uniforms(generators: Sequence[torch.Generator], n: int, device: torch.device | str) -> torch.Tensor:
    """n uniforms in [0, 1) per row from that row's own generator -> float32 [B, n], B = len(generators).

    Row b consumes exactly n numbers from generators[b], so its stream does not depend on the other rows of
    the batch. (It does depend on n: callers that want batch-independent streams should draw a fixed n per
    step.) Each generator must live on `device`.
    """
    if len(generators) == 0:
        return torch.empty(0, n, device=device)
    return torch.stack([torch.rand(n, generator=g, device=device) for g in generators])  # [B, n]


def one_token_acceptance(draft_logits: torch.Tensor, temperature: torch.Tensor, x: torch.Tensor,
                         p_x: torch.Tensor) -> torch.Tensor:
    """The chance that a one-token draft would have been accepted, estimated without verifying it, from the
    token x the target drew instead (a paused step's): float32 [...], unbiased over x ~ p.

    draft_logits [..., V'] the head's logits where the draft would have been drawn; temperature [...] the
    temperature it would have been drawn at (0: the head's argmax g is proposed); x int64 [...] the target's
    token in draft-vocabulary ids (-1: outside the draft vocabulary, which no draft proposes); p_x [...] the
    probability x had in the target's (processed) distribution p.

    - temperature 0: g is accepted iff u < p(g) (``verify_sampling``'s deterministic rule, and greedy's when p
      is one-hot), so P(accept) = p(g) = E_{x~p}[x == g]: the estimate is the hit x == g.
    - temperature t > 0: x' ~ q = softmax(logits / t) is accepted with min(1, p(x') / q(x')), so P(accept) =
      sum_x min(p(x), q(x)) = E_{x~p}[min(1, q(x) / p(x))]: the estimate is min(1, q(x) / p(x)).
    """
    t = temperature.to(draft_logits.dtype)[..., None]  # [..., 1]
    logq = torch.log_softmax(draft_logits / torch.where(t > 0, t, 1.0), dim=-1)  # [..., V']
    inside = x >= 0  # [...]
    q_x = logq.gather(-1, x.clamp(min=0)[..., None]).squeeze(-1).exp() * inside  # [...]
    sampled = (q_x / p_x.clamp_min(torch.finfo(torch.float32).tiny)).clamp(max=1.0)  # [...]
    hit = (argmax(draft_logits) == x) & inside  # [...]
    return torch.where(temperature > 0, sampled, hit.to(sampled.dtype)).float()
