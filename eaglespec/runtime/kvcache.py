"""Preallocated key/value cache with an explicit committed length per row.

The cache never reallocates. A forward pass writes the K/V of its T new tokens at slots
``lengths[row] + t`` and leaves ``lengths`` alone; the caller then decides what to keep:

* ``advance``  - plain tokens (prefill, vanilla decode): the new slots become committed;
* ``compact``  - a verified tree: the accepted path's slots are gathered into the contiguous region
  right after the prefix, then committed;
* ``rollback`` - move the pointer back (everything past it is garbage that the next write overwrites).

``rows`` arguments are int64 tensors of cache-row ids (unique within one call). ``None`` means rows
``0 .. B-1`` where B is the batch size of the other argument (all rows for ``reset``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ContextOverflowError", "HostRows", "KVCache"]


@dataclass(frozen=True)
class HostRows:
    """Host copies the caller already holds of a forward's cache rows, so planning its attention reads
    nothing back from the device (the decode loop keeps them: it reads the accepted counts once per step).

    ``rows`` are the values of the forward's ``rows`` tensor, ``lengths`` the committed lengths
    ``cache.lengths[rows]`` (exact: they decide the attended length S), ``max_position`` an upper bound of
    the forward's rotary positions (it only picks the precomputed rotary table or a fresh one).
    """

    rows: tuple[int, ...]
    lengths: tuple[int, ...]
    max_position: int


class ContextOverflowError(ValueError):
    """A write would pass the cache's ``max_len`` (or the model's attention window)."""


class KVCache:
    """K/V tensors ``[layers, max_batch, kv_heads, max_len, head_dim]`` plus ``lengths`` int64 ``[max_batch]``."""

    def __init__(
        self,
        n_layers: int,
        max_batch: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if min(n_layers, max_batch, n_kv_heads, max_len, head_dim) <= 0:
            raise ValueError("KVCache dimensions must all be positive")
        shape = (n_layers, max_batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, max_batch, Hkv, max_len, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, max_batch, Hkv, max_len, D]
        self.lengths = torch.zeros(max_batch, dtype=torch.int64, device=self.k.device)  # [max_batch]

    # ----------------------------------------------------------------------------------------- sizes
    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def max_batch(self) -> int:
        return self.k.shape[1]

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def head_dim(self) -> int:
        return self.k.shape[4]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    def rows_tensor(self, rows: Tensor | None, batch: int) -> Tensor:
        """int64 ``[B]`` row ids on the cache device; ``None`` -> ``arange(batch)``."""
        if rows is None:
            if batch > self.max_batch:
                raise ValueError(f"batch of {batch} rows but the cache holds only {self.max_batch}")
            return torch.arange(batch, device=self.device)
        return rows.to(device=self.device, dtype=torch.int64).reshape(-1)

    def _batch(self, rows: Tensor | None, batch: int | None) -> int:
        if rows is not None:
            return rows.numel()
        if batch is None:
            raise ValueError("pass `batch` when `rows` is None")
        return batch

    def _counts(self, counts: Tensor | int, batch: int) -> Tensor:
        if isinstance(counts, int):
            return torch.full((batch,), counts, dtype=torch.int64, device=self.device)
        return counts.to(device=self.device, dtype=torch.int64).reshape(-1)

    # -------------------------------------------------------------------------------- pointer moves
    def reset(self, rows: Tensor | None = None) -> None:
        """Forget rows (all rows when ``rows`` is None): ``lengths[rows] = 0``."""
        if rows is None:
            self.lengths.zero_()
        else:
            self.lengths[self.rows_tensor(rows, 0)] = 0

    def rollback(self, rows: Tensor | None, new_lengths: Tensor | int) -> None:
        """Move the pointers back: ``lengths[rows] = new_lengths``. K/V data is left as it is."""
        batch = new_lengths.numel() if isinstance(new_lengths, Tensor) else self.max_batch
        if rows is not None:
            batch = rows.numel()
        idx = self.rows_tensor(rows, batch)
        self.lengths[idx] = self._counts(new_lengths, idx.numel())

    def advance(self, rows: Tensor | None, counts: Tensor | int) -> None:
        """Commit the next ``counts`` written slots: ``lengths[rows] += counts``.

        With ``rows=None`` and an int ``counts`` every row advances.
        """
        batch = counts.numel() if isinstance(counts, Tensor) else self.max_batch
        if rows is not None:
            batch = rows.numel()
        idx = self.rows_tensor(rows, batch)
        self.lengths.index_add_(0, idx, self._counts(counts, idx.numel()))

    # ---------------------------------------------------------------------------------- compaction
    def compact(self, rows: Tensor | None, src_slots: Tensor, counts: Tensor) -> None:
        """Gather chosen slots into the contiguous region after each row's prefix and commit them.

        For batch entry b (cache row ``r = rows[b]``, prefix ``p = lengths[r]``) slot ``src_slots[b, i]``
        is copied to slot ``p + i`` for ``i < counts[b]``; then ``lengths[r] += counts[b]``.

        Precondition (always true for an accepted tree path written after the prefix):
        ``src_slots[b, i] >= p + i``. Sources and destinations may overlap: all sources are read
        before anything is written. Entries ``i >= counts[b]`` are ignored (may be -1 padding).

        Args:
            rows: int64 [B] cache rows, or None for ``arange(B)``.
            src_slots: int64 [B, M] absolute slot ids (e.g. the accepted path, root first).
            counts: int64 [B] number of leading ``src_slots`` entries to keep (0 <= counts <= M).
        """
        batch, m = src_slots.shape
        if m == 0:
            return
        idx = self.rows_tensor(rows, batch)  # [B]
        src = src_slots.to(device=self.device, dtype=torch.int64)  # [B, M]
        counts = self._counts(counts, batch)  # [B]
        start = self.lengths[idx]  # [B] prefix length p

        # Rewrite a window of M distinct slots containing [p, p + count); it is shifted left when it
        # would run past max_len (only possible when the destination ends near max_len). Window slots
        # outside the destination re-copy their own content, so each slot is written exactly once and
        # no data-dependent shapes (host syncs) are needed.
        win_start = torch.clamp(start, max=max(self.max_len - m, 0))  # [B]
        win = win_start[:, None] + torch.arange(m, device=self.device)  # [B, M] slots written
        offset = win - start[:, None]  # [B, M] index into src for each written slot
        take = (offset >= 0) & (offset < counts[:, None])  # [B, M]
        chosen = src.gather(1, offset.clamp(0, m - 1)).clamp_min(0)  # [B, M]
        read = torch.where(take, chosen, win)  # [B, M] slot whose content lands in `win`

        r = idx[:, None]  # [B, 1], broadcast against the [B, M] slot indices
        for buf in (self.k, self.v):
            # advanced indexing on dims 1 and 3: values are [B, M, L, Hkv, D]; the read is a copy,
            # taken before the write, which makes overlapping regions safe.
            buf[:, r, :, win] = buf[:, r, :, read]
        self.lengths.index_add_(0, idx, counts)

    # ----------------------------------------------------------------------------------- write slots
    def write_slots(self, rows: Tensor | None, n_new: int, batch: int | None = None) -> Tensor:
        """int64 ``[B, T]`` slots ``lengths[rows] + t`` where the next ``n_new`` tokens go (no checks).

        ``batch`` is needed only when ``rows`` is None.
        """
        idx = self.rows_tensor(rows, self._batch(rows, batch))
        return self.lengths[idx][:, None] + torch.arange(n_new, device=self.device)

    def overflow_error(self, rows: Tensor | None, n_new: int, batch: int, limit: int | None = None,
                       what: str = "max_len") -> ContextOverflowError | None:
        """The error to raise when some row cannot take ``n_new`` more tokens (None when all fit).

        ``limit`` defaults to ``max_len``; a model with an attention window passes its window.
        Syncs with the host (only called on error paths or from ``check_capacity``).
        """
        limit = self.max_len if limit is None else limit
        idx = self.rows_tensor(rows, batch)
        needed = self.lengths[idx] + n_new  # [B]
        over = (needed > limit).nonzero().flatten().tolist()
        if not over:
            return None
        b = over[0]
        return ContextOverflowError(
            f"context overflow: cache row {int(idx[b])} needs {int(needed[b])} slots "
            f"({int(self.lengths[idx[b]])} cached + {n_new} new) but {what} is {limit}"
            + (f" ({len(over)} rows overflow)" if len(over) > 1 else "")
        )

    def check_capacity(self, rows: Tensor | None, n_new: int, batch: int | None = None) -> None:
        """Raise ``ContextOverflowError`` if writing ``n_new`` tokens would pass ``max_len`` in any row."""
        err = self.overflow_error(rows, n_new, self._batch(rows, batch))
        if err is not None:
            raise err

    def __repr__(self) -> str:
        return (
            f"KVCache(layers={self.n_layers}, max_batch={self.max_batch}, kv_heads={self.n_kv_heads}, "
            f"max_len={self.max_len}, head_dim={self.head_dim}, dtype={self.dtype}, device={self.device})"
        )
