"""`SequenceStats`: what one sequence's decoding cost and how much speculation it accepted.

One vocabulary for every consumer (engine, `generate --json`, bench records and report, server metrics,
training eval, diagnose):
- `tau` (mean acceptance length) = decode tokens / target verification forwards after prefill
  = (new_tokens - 1) / target_forwards: the prefill's token is not a decode step, the bonus token counts,
  1.0 = no gain (docs/BENCHMARKS.md "Metrics");
- `accepted_per_position[d]` = verification rounds in which the draft token at depth d + 1 was accepted
  (counts); `acceptance_by_position()` = those counts / rounds (rates);
- `prefill_s`, `draft_s` (drafting + draft-KV commit), `verify_s` (target forward + verification), `wall_s`.
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

    @classmethod
    def from_record(cls, r: dict) -> SequenceStats:
        """The stats of a `generate --json` object or a bench record (missing or null counts are 0)."""
        return cls(prompt_tokens=r.get("prompt_tokens") or 0, new_tokens=r.get("new_tokens") or 0,
                   target_forwards=r.get("target_forwards") or 0,
                   accepted_per_position=list(r.get("accepted_per_position") or []))

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
        return total
