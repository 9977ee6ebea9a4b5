"""Typed configuration shared by the library, the CLI and (later) the server.

Every user-facing knob lives in one of these dataclasses, with its meaning written once here; the CLI
builds its flags from the same names and the validators below give every bad value a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the target distribution.

    The same processing (temperature -> top-k -> top-p) is applied in vanilla decoding and in speculative
    verification, so speculation never changes the output distribution.
    """

    temperature: float = 0.0
    """0 = greedy (argmax); > 0 samples from softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of most likely tokens with mass >= top_p (1.0 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    seed: int | None = None
    """Seed of the per-sequence random generator; the same seed gives the same tokens regardless of batch."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature != self.temperature:
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")


@dataclass(frozen=True)
class GenerationConfig:
    """When generation stops and how tokens are chosen."""

    max_new_tokens: int = 128
    """Hard budget of generated tokens per sequence (EOS and the token completing a stop string count)."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends when the text contains one; the returned text ends before it."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS tokens (benchmarks that need equal token counts)."""

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        for s in self.stop:
            if not isinstance(s, str) or s == "":
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        self.sampling.validate()
