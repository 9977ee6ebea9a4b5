"""Typed configuration shared by the library, the CLI and (later) the server.

Every user-facing knob lives in one of these dataclasses, with its meaning written once here; the CLI
builds its flags from the same names and the validators below give every bad value a clear error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A configuration value its rule refuses; ``param`` names the field (e.g. "temperature")."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the target distribution.

    The same processing (temperature -> top-k -> top-p) is applied in vanilla decoding and in speculative
    verification, so speculation never changes the output distribution.

    Validated on construction, with the one rule set of the project: the CLI, the server and the Python API
    all build one, so a bad value is refused at the boundary with a ``ConfigError`` naming it, and the layers
    below (engine, sampling) take the values as valid.
    """

    temperature: float = 0.0
    """0 = greedy (argmax); > 0 (finite) samples from softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of most likely tokens with mass >= top_p (1.0 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    seed: int | None = None
    """Seed of the per-sequence random generator; the same seed gives the same tokens regardless of batch."""

    def __post_init__(self) -> None:
        t = self.temperature
        if not _is_number(t) or math.isnan(t):
            raise ConfigError("temperature", f"temperature must be a number, got {t!r}")
        if t < 0 or math.isinf(t):
            raise ConfigError("temperature", f"temperature must be finite and >= 0 (0 = greedy), got {t}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError("top_p", f"top_p must be in (0, 1] (1.0 = off), got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ConfigError("top_k", f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ConfigError("seed", f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationConfig:
    """When generation stops and how tokens are chosen. Validated on construction (``ConfigError``)."""

    max_new_tokens: int = 128
    """Hard budget of generated tokens per sequence (EOS and the token completing a stop string count)."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends when the text contains one; the returned text ends before it."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS tokens (benchmarks that need equal token counts)."""

    def __post_init__(self) -> None:
        n = self.max_new_tokens
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError("max_new_tokens", f"max_new_tokens must be an integer >= 1, got {n!r}")
        if not isinstance(self.sampling, SamplingParams):
            raise ConfigError("sampling", f"sampling must be a SamplingParams, got {type(self.sampling).__name__}")
        for s in self.stop:
            if not isinstance(s, str) or s == "":
                raise ConfigError("stop", f"stop strings must be non-empty strings, got {s!r}")
