"""Exact truncation of committed tokens at EOS, stop strings and the token budget.

Speculative decoding commits several tokens per step, so every stop rule must be applied token by token
inside a chunk: nothing after the stopping token is returned or counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting multi-byte characters.

    Decoding every token on its own breaks characters spread over several byte-level tokens and drops the
    leading spaces some tokenizers attach to a word, so each delta is the difference between decoding a
    short window that ends with the new tokens and the same window without them. Cost per token is O(window),
    not O(length).
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # ids before this index have been emitted as text

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the newly completed text (may be "" while a character is incomplete)."""
        self.ids.extend(token_ids)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""  # an unfinished multi-byte character (or a token with no text): wait for more
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Text still held back at the end of generation (an incomplete character is emitted as is)."""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""


@dataclass
class StopResult:
    token_ids: list[int]  # the tokens kept from this chunk
    text: str  # text delta for the kept tokens (stop string and everything after it removed)
    finished: bool
    finish_reason: str | None  # "stop" (EOS or stop string) or "length"


class StopChecker:
    """Per-sequence stop state: EOS ids, stop strings and the remaining token budget.

    With stop strings, the last ``max_stop_len - 1`` characters are held back from the returned deltas until
    the sequence ends, because a stop string may start in them and the caller may already have streamed
    whatever was returned.
    """

    def __init__(
        self,
        tokenizer,
        eos_token_ids: Sequence[int],
        max_new_tokens: int,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
    ):
        self.detok = IncrementalDetokenizer(tokenizer)
        self.eos = frozenset(() if ignore_eos else eos_token_ids)
        self.stop = tuple(stop)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.remaining = max_new_tokens
        self.text = ""  # all text decoded so far (the final text once finished)
        self.emitted = 0  # characters of self.text already returned
        self.finished = False

    def feed(self, token_ids: Sequence[int]) -> StopResult:
        """Consume a chunk of committed tokens in order; stop at the first token that ends generation."""
        if self.finished:
            raise RuntimeError("feed() called on a finished sequence")
        kept: list[int] = []
        reason: str | None = None
        for tok in token_ids:
            tok = int(tok)
            kept.append(tok)
            self.remaining -= 1
            if tok in self.eos:
                reason = "stop"  # EOS is counted and returned in token_ids, but has no text
                break
            delta = self.detok.add([tok])
            if delta and self.stop:
                # Only where a stop string could newly appear: it may straddle the previous text's end.
                start = max(0, len(self.text) - self.hold)
                self.text += delta
                hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
                if hits:
                    self.text = self.text[: min(hits)]
                    reason = "stop"
                    break
            else:
                self.text += delta
            if self.remaining <= 0:
                reason = "length"
                break
        if reason is not None:
            self.finished = True
            if reason == "length" or kept[-1] in self.eos:
                self.text += self.detok.flush()
            end = len(self.text)
        else:
            end = max(self.emitted, len(self.text) - self.hold)
        delta_text, self.emitted = self.text[self.emitted : end], end
        return StopResult(kept, delta_text, self.finished, reason)
