"""KVCache: pointer moves, write slots, overflow errors and compaction against a slot-by-slot oracle."""

from __future__ import annotations

import pytest
import torch

from eaglespec.runtime.kvcache import ContextOverflowError, KVCache


def _filled_cache(max_batch: int = 3, max_len: int = 12, layers: int = 2) -> KVCache:
    cache = KVCache(layers, max_batch, 2, max_len, 4, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    return cache


def _compact_oracle(cache: KVCache, rows: list[int], src: list[list[int]], counts: list[int]):
    """Slot-by-slot reference: read all sources first, then write them after the prefix."""
    k, v, lengths = cache.k.clone(), cache.v.clone(), cache.lengths.clone()
    for r, s, c in zip(rows, src, counts):
        p = int(lengths[r])
        kk = [cache.k[:, r, :, s[i]].clone() for i in range(c)]
        vv = [cache.v[:, r, :, s[i]].clone() for i in range(c)]
        for i in range(c):
            k[:, r, :, p + i] = kk[i]
            v[:, r, :, p + i] = vv[i]
        lengths[r] = p + c
    return k, v, lengths


def test_shapes_and_defaults():
    cache = KVCache(3, 2, 4, 16, 8, dtype=torch.bfloat16)
    assert cache.k.shape == (3, 2, 4, 16, 8) and cache.v.shape == cache.k.shape
    assert cache.k.dtype == torch.bfloat16 and cache.lengths.dtype == torch.int64
    assert cache.lengths.tolist() == [0, 0]
    assert (cache.n_layers, cache.max_batch, cache.n_kv_heads, cache.max_len, cache.head_dim) == (3, 2, 4, 16, 8)


def test_advance_rollback_reset():
    cache = KVCache(1, 4, 1, 32, 2)
    cache.advance(None, torch.tensor([3, 5]))  # rows 0, 1
    assert cache.lengths.tolist() == [3, 5, 0, 0]
    cache.advance(torch.tensor([3, 1]), torch.tensor([7, 1]))
    assert cache.lengths.tolist() == [3, 6, 0, 7]
    cache.advance(None, 2)  # int count, no rows: every row
    assert cache.lengths.tolist() == [5, 8, 2, 9]
    cache.rollback(torch.tensor([1, 3]), torch.tensor([4, 0]))
    assert cache.lengths.tolist() == [5, 4, 2, 0]
    cache.reset(torch.tensor([0]))
    assert cache.lengths.tolist() == [0, 4, 2, 0]
    cache.reset()
    assert cache.lengths.tolist() == [0, 0, 0, 0]


def test_write_slots():
    cache = KVCache(1, 3, 1, 32, 2)
    cache.advance(None, torch.tensor([2, 0, 5]))
    assert cache.write_slots(torch.tensor([2, 0]), 3).tolist() == [[5, 6, 7], [2, 3, 4]]
    assert cache.write_slots(None, 2, batch=2).tolist() == [[2, 3], [0, 1]]


def test_overflow_error_names_row_needed_and_max_len():
    cache = KVCache(1, 3, 1, 10, 2)
    cache.advance(None, torch.tensor([2, 8, 4]))
    cache.check_capacity(torch.tensor([0, 2]), 6)  # 8 and 10 fit exactly
    with pytest.raises(ContextOverflowError) as err:
        cache.check_capacity(torch.tensor([0, 1]), 3)
    msg = str(err.value)
    assert "row 1" in msg and "11" in msg and "10" in msg
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    "rows, prefix, src, counts",
    [
        ([0], [4], [[4, 6, 9]], [3]),  # a tree path: root in place, later nodes shift left
        ([1, 2], [3, 5], [[3, 4, 5, 6], [6, 8, 10, -1]], [4, 3]),  # one chain fully in place; -1 padding
        ([2, 0], [2, 0], [[2, 3, 7], [5, 9, 11]], [1, 2]),  # counts below M, unsorted rows
        ([0], [3], [[3, 4, 5]], [0]),  # nothing accepted
        ([1], [8], [[9, 10, 11, 11, -1, -1]], [3]),  # window shifted left at the end of the cache (M=6)
        ([0], [0], [[1, 2, 3, 4, 5]], [5]),  # every source overlaps the next destination
    ],
)
def test_compact_matches_oracle(rows, prefix, src, counts):
    cache = _filled_cache()
    cache.rollback(torch.tensor(rows), torch.tensor(prefix))
    k_ref, v_ref, len_ref = _compact_oracle(cache, rows, src, counts)
    cache.compact(torch.tensor(rows), torch.tensor(src), torch.tensor(counts))
    assert torch.equal(cache.lengths, len_ref)
    assert torch.equal(cache.k, k_ref)
    assert torch.equal(cache.v, v_ref)


def test_compact_rows_none_uses_leading_rows():
    cache = _filled_cache()
    cache.rollback(None, torch.tensor([1, 2]))
    k_ref, v_ref, len_ref = _compact_oracle(cache, [0, 1], [[2, 4], [5, 6]], [2, 1])
    cache.compact(None, torch.tensor([[2, 4], [5, 6]]), torch.tensor([2, 1]))
    assert torch.equal(cache.k, k_ref) and torch.equal(cache.v, v_ref) and torch.equal(cache.lengths, len_ref)
