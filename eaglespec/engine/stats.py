"""`SequenceStats`: what one sequence's decoding cost and how much speculation it accepted.

One vocabulary for every consumer (engine, `generate --json`, bench records and report, server metrics,
training eval, diagnose):
- `tau` (mean acceptance length) = decode tokens / target verification forwards after prefill
  = (new_tokens - 1) / target_forwards: the prefill's token is not a decode step, the bonus token counts,
  1.0 = no gain (docs/BENCHMARKS.md "Metrics");
- `accepted_per_position[d]` = verification rounds in which the draft token at depth d + 1 was accepted
  (counts); `acceptance_by_position()` = those counts / rounds (rates);
- `prefill_s`, `draft_s` (drafting + draft-KV commit), `verify_s` (target forward + verification), `wall_s`;
- `tree_rounds[label]` = verification rounds run with each tree (the strategy's `label`: "chain3", "none" for a
  plain step while the dispatcher paused drafting, ...);
- `predicted_speedup`: what the cost model predicted for the trees the dispatcher chose (adaptive dispatch
  only): predicted tokens per second over calibrated plain tokens per second, summed over the rounds before
  dividing (`predicted_tokens`, `predicted_s`, `predicted_vanilla_s`), so that it compares with a measured
  tokens/s ratio; a mean of per-round speedups would not (docs/DISPATCH.md, "Predicted and measured").
Pooling many sequences (`pooled`) sums numerators and denominators, so a pooled tau weighs every round alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class SequenceStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0  # verification forwards after prefill
    accepted_per_position: list[int] = field(default_factory=list)  # rounds in which depth d+1 was accepted
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    wall_s: float = 0.0  # prefill + decode, from admission to the last token
    sequences: int = 1  # sequences summed into these stats (`pooled`); each has one prefill token
    tree_rounds: dict[str, int] = field(default_factory=dict)  # verification rounds per tree label
    predicted_rounds: int = 0  # rounds with a cost-model prediction (adaptive dispatch)
    predicted_tokens: float = 0.0  # sum over those rounds of the predicted tokens per round, E[tokens]
    predicted_s: float = 0.0  # sum of the predicted step seconds, draft(b, s) + verify(b, nodes)
    predicted_vanilla_s: float = 0.0  # sum of the calibrated plain-step seconds at the same batch, verify(b, 1)

    @property
    def decode_tokens(self) -> int:
        """Tokens committed by verification rounds (each sequence's prefill token excluded)."""
        return self.new_tokens - self.sequences if self.target_forwards else 0

    @property
    def tau(self) -> float:
        """Mean acceptance length: decode tokens / target forwards after prefill (0.0 before any round)."""
        return self.decode_tokens / self.target_forwards if self.target_forwards else 0.0

    def acceptance_by_position(self, depth: int | None = None) -> list[float]:
        """[d] = fraction of verification rounds in which the draft token at depth d + 1 was accepted."""
        n = len(self.accepted_per_position) if depth is None else depth
        counts = self.accepted_per_position + [0] * max(0, n - len(self.accepted_per_position))
        return [c / self.target_forwards if self.target_forwards else 0.0 for c in counts[:n]]

    def record_accepted(self, k: int) -> None:
        """One verification round that accepted k draft tokens (depths 1..k)."""
        self.target_forwards += 1
        if len(self.accepted_per_position) < k:
            self.accepted_per_position.extend([0] * (k - len(self.accepted_per_position)))
        for d in range(k):
            self.accepted_per_position[d] += 1

    def record_tree(self, label: str | None, choice=None) -> None:
        """The tree of one verification round (by label) and the cost model's ``costmodel.Choice`` for it."""
        if label is not None:
            self.tree_rounds[label] = self.tree_rounds.get(label, 0) + 1
        if choice is not None:
            self.predicted_rounds += 1
            self.predicted_tokens += choice.expected_tokens
            self.predicted_s += choice.step_s
            self.predicted_vanilla_s += choice.vanilla_s

    @property
    def predicted_speedup(self) -> float | None:
        """Predicted tokens/s (sum E[tokens] / sum step seconds) over calibrated plain tokens/s (rounds / sum
        verify(b, 1)); None without predictions."""
        if not self.predicted_rounds or self.predicted_s <= 0:
            return None
        return self.predicted_tokens * self.predicted_vanilla_s / (self.predicted_s * self.predicted_rounds)

    def dispatch_record(self) -> dict:
        """The tree and prediction fields of a `generate --json` object or a bench record."""
        sp = self.predicted_speedup
        return {"tree_rounds": dict(sorted(self.tree_rounds.items())),
                "predicted_speedup": None if sp is None else round(sp, 4),
                "predicted_rounds": self.predicted_rounds, "predicted_tokens": round(self.predicted_tokens, 4),
                "predicted_s": round(self.predicted_s, 7), "predicted_vanilla_s": round(self.predicted_vanilla_s, 7)}

    @classmethod
    def from_record(cls, r: dict) -> SequenceStats:
        """The stats of a `generate --json` object or a bench record (missing or null counts are 0)."""
        return cls(prompt_tokens=r.get("prompt_tokens") or 0, new_tokens=r.get("new_tokens") or 0,
                   target_forwards=r.get("target_forwards") or 0,
                   accepted_per_position=list(r.get("accepted_per_position") or []),
                   draft_s=r.get("draft_s") or 0.0, verify_s=r.get("verify_s") or 0.0,
                   tree_rounds=dict(r.get("tree_rounds") or {}), predicted_rounds=r.get("predicted_rounds") or 0,
                   predicted_tokens=r.get("predicted_tokens") or 0.0, predicted_s=r.get("predicted_s") or 0.0,
                   predicted_vanilla_s=r.get("predicted_vanilla_s") or 0.0)

    @classmethod
    def pooled(cls, stats: Iterable[SequenceStats]) -> SequenceStats:
        """Sums over sequences that ran verification rounds: pooled tau and acceptance weigh rounds alike."""
        total = cls(sequences=0)
        for s in stats:
            if not s.target_forwards:
                continue
            total.prompt_tokens += s.prompt_tokens
            total.sequences += s.sequences
            total.new_tokens += s.new_tokens
            total.target_forwards += s.target_forwards
            for d, c in enumerate(s.accepted_per_position):
                if d == len(total.accepted_per_position):
                    total.accepted_per_position.append(0)
                total.accepted_per_position[d] += c
            total.prefill_s += s.prefill_s
            total.draft_s += s.draft_s
            total.verify_s += s.verify_s
            total.wall_s += s.wall_s
            for label, n in s.tree_rounds.items():
                total.tree_rounds[label] = total.tree_rounds.get(label, 0) + n
            total.predicted_rounds += s.predicted_rounds
            total.predicted_tokens += s.predicted_tokens
            total.predicted_s += s.predicted_s
            total.predicted_vanilla_s += s.predicted_vanilla_s
        return total
