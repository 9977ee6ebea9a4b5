"""Target features for draft-head training: offline capture to safetensors shards, or online on the fly.

Both paths produce the same ``FeatureBatch`` (right-padded):
    input_ids [B, T] int64, loss_mask [B, T] bool, lengths [B] int64,
    hidden [B, T, H]  final-normed hidden states (EAGLE-1 feature; lm_head(hidden) = the target's logits),
    aux [B, T, F]     EAGLE-3 features: the HF hidden_states at ``hidden_indices``, concatenated, or None,
    top1 [B, T] int64 the target's argmax token after each position (argmax lm_head(hidden)).
Logits are never stored (V = 49152 floats per token); training recomputes the target distribution from
``hidden`` with the target's lm_head, and ``top1`` (4 bytes per token) saves the full-vocabulary argmax.

Offline layout (a directory):
  * ``shard-00000.safetensors`` ...: the records ``[first_record, first_record + n)`` of the prepared data,
    concatenated along the token axis: ``input_ids`` int32 [N], ``loss_mask`` uint8 [N], ``top1`` int32 [N],
    ``offsets`` int64 [n + 1], ``record_index`` int64 [n], ``hidden`` [N, H], ``aux`` [N, F] (optional);
  * ``manifest.json``: model name and fingerprint, sizes, ``hidden_indices`` with their convention
    ("hf_hidden_states_index"), storage dtype, the prepared data's hash, and the finished shards. Shards are
    written to a temporary name and renamed, then listed in the manifest (also replaced atomically), so a
    killed capture resumes by skipping the listed shards.

Batches for training come from ``epoch_batches``: a seeded shuffle per epoch, length-grouped global batches
of ``batch_size * world_size`` records, each rank taking every ``world_size``-th record of a global batch
(DistributedSampler-style). An incomplete last global batch is dropped.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from eaglespec.train.data import DATA_FILE, PreparedRecord, _sha256, read_prepared
from eaglespec.spec.heads import OUR_CONVENTION

log = logging.getLogger(__name__)

__all__ = [
    "FeatureBatch",
    "FeatureStore",
    "OfflineFeatures",
    "OnlineFeatures",
    "capture_batch",
    "capture_features",
    "epoch_batches",
    "model_fingerprint",
]

MANIFEST_FILE = "manifest.json"
FORMAT = "eaglespec-features"
VERSION = 1


@dataclass
class FeatureBatch:
    """One right-padded batch of records with the target's features (see the module docstring)."""

    input_ids: Tensor  # int64 [B, T]
    loss_mask: Tensor  # bool [B, T]
    lengths: Tensor  # int64 [B]
    hidden: Tensor  # [B, T, H]
    aux: Tensor | None  # [B, T, F]
    top1: Tensor  # int64 [B, T]
    record_index: Tensor  # int64 [B], index of each record in the prepared data

    def to(self, device: torch.device | str) -> FeatureBatch:
        return FeatureBatch(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                               for f in fields(self)})

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum())


def model_fingerprint(model: Any) -> str:
    """A short hash of a few target weights: features of another model (same sizes) are refused. The weights
    are rounded to bfloat16 first, so the same model loaded in float32 or bfloat16 has the same fingerprint."""
    h = hashlib.sha256()
    for t in (model.embed_tokens.weight[:8], model.norm, model.lm_head_weight[-8:]):
        h.update(t.detach().cpu().to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]


def _top1(hidden: Tensor, lm_head_weight: Tensor, chunk: int = 1024) -> Tensor:
    """int64 [B, T] argmax of lm_head(hidden), in chunks of tokens (full-vocabulary logits are large)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.int64, device=hidden.device)
    for s in range(0, flat.shape[0], chunk):
        out[s : s + chunk] = F.linear(flat[s : s + chunk], lm_head_weight).argmax(-1)
    return out.view(hidden.shape[:-1])


def _pad(seqs: Sequence[Sequence[int]], device: torch.device | str, dtype: torch.dtype = torch.int64) -> Tensor:
    width = max(len(s) for s in seqs)
    out = torch.zeros(len(seqs), width, dtype=dtype)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = torch.as_tensor(s, dtype=dtype)
    return out.to(device)


@torch.no_grad()
def capture_batch(model: Any, records: Sequence[PreparedRecord], hidden_indices: Sequence[int],
                  record_index: Sequence[int] | None = None) -> FeatureBatch:
    """Run the target over ``records`` (one right-padded batch, fresh cache) and return their features.

    Right padding never changes the features of real tokens (causal attention); padded positions are zeroed
    (as in batches read from disk).
    """
    device = model.device
    ids = _pad([r.input_ids for r in records], device)  # [B, T]
    mask = _pad([r.loss_mask for r in records], device).bool()
    lengths = torch.tensor([len(r.input_ids) for r in records], device=device)
    batch, width = ids.shape
    out = model(ids, torch.arange(width, device=device).expand(batch, width), model.new_cache(batch, width),
                hidden_indices=tuple(hidden_indices))
    pad = (torch.arange(width, device=device)[None, :] >= lengths[:, None])  # [B, T]
    hidden = out.hidden.masked_fill(pad[:, :, None], 0)  # zeros at padding, as the offline reader pads
    aux = out.aux.masked_fill(pad[:, :, None], 0) if out.aux is not None else None
    top1 = _top1(hidden, model.lm_head_weight).masked_fill(pad, 0)
    index = torch.tensor(list(record_index) if record_index is not None else [-1] * batch, device=device)
    return FeatureBatch(ids, mask, lengths, hidden, aux, top1, index)


def _length_batches(order: Sequence[int], lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Consecutive groups of ``order`` whose padded size (count * longest) stays within ``batch_tokens``."""
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        n = lengths[i]
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    return batches


# ============================================================================================ offline
def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def capture_features(
    target: Any,
    data: str | os.PathLike[str],
    output: str | os.PathLike[str],
    hidden_indices: Sequence[int] = (),
    store_dtype: torch.dtype = torch.bfloat16,
    shard_records: int = 256,
    batch_tokens: int = 4096,
    limit: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Capture the target's features over prepared data into shards (resumable); returns the manifest.

    ``hidden_indices`` () captures only ``hidden`` (EAGLE-1); EAGLE-3 needs its feature layer ids (e.g.
    ``heads.default_feature_layer_ids(L)``). ``store_dtype`` is the on-disk dtype of hidden/aux.
    """
    from safetensors.torch import save_file
    from tqdm import tqdm

    model = target.model
    records, data_manifest = read_prepared(data)
    if limit is not None:
        records = records[:limit]
    data_dir = Path(data) if Path(data).is_dir() else Path(data).parent
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    bad = [i for i in hidden_indices if not 0 <= i <= model.args.num_hidden_layers]
    if bad:
        raise ValueError(f"hidden_indices {bad} outside [0, {model.args.num_hidden_layers}]")
    settings = {
        "format": FORMAT,
        "version": VERSION,
        "model": target.name,
        "model_fingerprint": model_fingerprint(model),
        "vocab_size": model.args.vocab_size,
        "hidden_size": model.args.hidden_size,
        "num_layers": model.args.num_hidden_layers,
        "hidden_indices": [int(i) for i in hidden_indices],
        "feature_layer_convention": OUR_CONVENTION,
        "dtype": str(store_dtype).removeprefix("torch."),
        "compute_dtype": getattr(model, "precision", str(model.dtype).removeprefix("torch.")),
        "data": str(data_dir.resolve()),
        "data_sha256": data_manifest.get("data_sha256") or _sha256(data_dir / DATA_FILE),
        "records": len(records),
        "shard_records": shard_records,
    }
    manifest_path = out / MANIFEST_FILE
    shards: list[dict[str, Any]] = []
    if manifest_path.is_file():
        old = json.loads(manifest_path.read_text())
        differs = [k for k in settings if old.get(k) != settings[k]]
        if differs:
            raise ValueError(f"{out} holds features captured with other settings ({', '.join(differs)}); "
                             f"use another output directory")
        shards = [s for s in old["shards"] if (out / s["file"]).is_file()
                  and (out / s["file"]).stat().st_size == s["bytes"]]
    done = {s["first_record"] for s in shards}
    starts = [s for s in range(0, len(records), shard_records) if s not in done]
    total_tokens = sum(len(r.input_ids) for s in starts for r in records[s : s + shard_records])
    log.info("capturing %d shards (%d tokens); %d shards already done in %s", len(starts), total_tokens,
             len(done), out)
    t0, n_done = time.perf_counter(), 0
    bar = tqdm(total=total_tokens, desc="capture", unit="tok", unit_scale=True, disable=not progress or None)
    for first in starts:
        part = list(range(first, min(first + shard_records, len(records))))
        lengths = [len(records[i].input_ids) for i in part]
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        n_tok = offsets[-1]
        hidden = torch.empty(n_tok, model.args.hidden_size, dtype=store_dtype)
        aux = torch.empty(n_tok, model.args.hidden_size * len(hidden_indices), dtype=store_dtype) \
            if hidden_indices else None
        top1 = torch.empty(n_tok, dtype=torch.int32)
        by_len = sorted(range(len(part)), key=lambda j: -lengths[j])  # local positions, longest first
        for group in _length_batches(by_len, lengths, batch_tokens):
            fb = capture_batch(model, [records[part[j]] for j in group], hidden_indices)
            for b, j in enumerate(group):
                lo, n = offsets[j], lengths[j]
                hidden[lo : lo + n] = fb.hidden[b, :n].to("cpu", store_dtype)
                top1[lo : lo + n] = fb.top1[b, :n].to("cpu", torch.int32)
                if aux is not None:
                    aux[lo : lo + n] = fb.aux[b, :n].to("cpu", store_dtype)
            bar.update(sum(lengths[j] for j in group))
            n_done += sum(lengths[j] for j in group)
        tensors = {
            "input_ids": torch.tensor([t for i in part for t in records[i].input_ids], dtype=torch.int32),
            "loss_mask": torch.tensor([t for i in part for t in records[i].loss_mask], dtype=torch.uint8),
            "top1": top1,
            "offsets": torch.tensor(offsets, dtype=torch.int64),
            "record_index": torch.tensor(part, dtype=torch.int64),
            "hidden": hidden,
        }
        if aux is not None:
            tensors["aux"] = aux
        name = f"shard-{first // shard_records:05d}.safetensors"
        tmp = out / f".{name}.tmp-{os.getpid()}"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, out / name)
        shards.append({"file": name, "first_record": first, "n_records": len(part), "n_tokens": n_tok,
                       "bytes": (out / name).stat().st_size})
        shards.sort(key=lambda s: s["first_record"])
        manifest = {**settings, "shards": shards, "complete": len(shards) * shard_records >= len(records)}
        _write_atomic(manifest_path, json.dumps(manifest, indent=2) + "\n")
    bar.close()
    elapsed = time.perf_counter() - t0
    if n_done:
        log.info("captured %d tokens in %.1f s (%.0f tokens/s)", n_done, elapsed, n_done / elapsed)
    manifest = {**settings, "shards": shards, "complete": True}
    _write_atomic(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return manifest


class FeatureStore:
    """Random access to the records of a capture directory (memory-mapped slices of the shards)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        path = self.directory / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{self.directory}: no {MANIFEST_FILE} (run `eaglespec capture-features`)")
        self.manifest = json.loads(path.read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{self.directory}: not a feature directory (format {self.manifest.get('format')!r})")
        if not self.manifest.get("complete"):
            raise ValueError(f"{self.directory}: the capture is incomplete; rerun capture-features to finish it")
        self.hidden_indices = tuple(self.manifest["hidden_indices"])
        self._files = []
        self._offsets: list[list[int]] = []
        self._first: list[int] = []
        self.lengths: list[int] = []
        self.record_index: list[int] = []
        for s in self.manifest["shards"]:
            f, offsets = self._open_shard(self.directory / s["file"])
            self._files.append(f)
            self._offsets.append(offsets)
            self._first.append(len(self.lengths))
            self.lengths += [b - a for a, b in zip(offsets, offsets[1:])]
            self.record_index += f.get_tensor("record_index").tolist()

    def _open_shard(self, path: Path) -> tuple[Any, list[int]]:
        """Open a shard and check that its tensors cover its records; a damaged shard is refused naming it."""
        from safetensors import SafetensorError, safe_open

        try:
            f = safe_open(str(path), framework="pt")
            offsets = f.get_tensor("offsets").tolist()
            keys = set(f.keys())
            rows = {k: f.get_slice(k).get_shape()[0] for k in ("input_ids", "loss_mask", "top1", "hidden")}
        except (SafetensorError, OSError, KeyError, ValueError) as e:
            raise ValueError(f"{path}: unreadable feature shard ({e}); rerun `eaglespec capture-features`") from None
        if self.hidden_indices and "aux" in keys:
            rows["aux"] = f.get_slice("aux").get_shape()[0]
        bad = ((not offsets or offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])))
               or any(n != offsets[-1] for n in rows.values()))
        if bad:
            raise ValueError(f"{path}: corrupt feature shard: offsets do not match the tensors' rows "
                             f"({ {k: n for k, n in rows.items()} }, last offset {offsets[-1] if offsets else None}); "
                             f"rerun `eaglespec capture-features`")
        return f, offsets

    def __len__(self) -> int:
        return len(self.lengths)

    def check_target(self, model: Any, name: str | None = None) -> None:
        """Refuse features captured from another model."""
        fp = model_fingerprint(model)
        if self.manifest["model_fingerprint"] != fp:
            raise ValueError(f"{self.directory}: features were captured from {self.manifest['model']!r} "
                             f"(fingerprint {self.manifest['model_fingerprint']}), not from the loaded target "
                             f"{name or ''} (fingerprint {fp})")

    def _locate(self, i: int) -> tuple[Any, int, int]:
        s = bisect.bisect_right(self._first, i) - 1
        offsets = self._offsets[s]
        j = i - self._first[s]
        return self._files[s], offsets[j], offsets[j + 1]

    def tokens(self, i: int) -> tuple[list[int], list[int]]:
        """(input_ids, loss_mask) of record i."""
        f, lo, hi = self._locate(i)
        return f.get_slice("input_ids")[lo:hi].tolist(), f.get_slice("loss_mask")[lo:hi].tolist()

    def record(self, i: int, want_aux: bool = True) -> dict[str, Tensor]:
        f, lo, hi = self._locate(i)
        rec = {k: f.get_slice(k)[lo:hi] for k in ("input_ids", "loss_mask", "top1", "hidden")}
        if want_aux and self.hidden_indices:
            rec["aux"] = f.get_slice("aux")[lo:hi]
        return rec

    def batch(self, indices: Sequence[int], want_aux: bool = True, max_len: int | None = None) -> FeatureBatch:
        recs = [self.record(i, want_aux) for i in indices]
        if max_len is not None:
            recs = [{k: v[:max_len] for k, v in r.items()} for r in recs]
        lengths = [r["input_ids"].shape[0] for r in recs]
        width, batch = max(lengths), len(recs)

        def stack(key: str, dtype: torch.dtype | None = None) -> Tensor:
            first = recs[0][key]
            out = torch.zeros((batch, width, *first.shape[1:]), dtype=dtype or first.dtype)
            for b, r in enumerate(recs):
                out[b, : lengths[b]] = r[key]
            return out

        return FeatureBatch(
            input_ids=stack("input_ids", torch.int64),
            loss_mask=stack("loss_mask", torch.bool),
            lengths=torch.tensor(lengths),
            hidden=stack("hidden"),
            aux=stack("aux") if want_aux and self.hidden_indices else None,
            top1=stack("top1", torch.int64),
            record_index=torch.tensor([self.record_index[i] for i in indices]),
        )


# ========================================================================================= batching
def epoch_batches(lengths: Sequence[int], indices: Sequence[int], batch_size: int, seed: int, epoch: int,
                  world_size: int = 1, rank: int = 0, group: int = 16) -> list[list[int]]:
    """This rank's batches for one epoch (record indices), the same on every run with the same arguments.

    Indices are shuffled with (seed, epoch), cut into windows of ``group`` global batches, sorted by length
    inside a window (less padding), cut into global batches of ``batch_size * world_size``, and the global
    batches shuffled again. Rank r takes records r, r + W, ... of each global batch.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = [indices[i] for i in torch.randperm(len(indices), generator=gen).tolist()]
    size = batch_size * world_size
    window = size * group
    global_batches = []
    for w in range(0, len(order) - size + 1, window):
        chunk = sorted(order[w : w + window], key=lambda i: lengths[i])
        global_batches += [chunk[s : s + size] for s in range(0, len(chunk) - size + 1, size)]
    perm = torch.randperm(len(global_batches), generator=gen).tolist()
    return [global_batches[p][rank::world_size] for p in perm]


class _Loader:
    """Iterates FeatureBatches of a set of records, epoch after epoch, from any (epoch, batch) position."""

    def __init__(self, lengths: Sequence[int], indices: Sequence[int], batch_size: int, seed: int,
                 world_size: int = 1, rank: int = 0) -> None:
        self.lengths, self.indices = list(lengths), list(indices)
        self.batch_size, self.seed, self.world_size, self.rank = batch_size, seed, world_size, rank
        if len(self.indices) < batch_size * world_size:
            raise ValueError(f"{len(self.indices)} training records are fewer than one global batch "
                             f"({batch_size} x {world_size} ranks)")

    def batches_per_epoch(self) -> int:
        return len(epoch_batches(self.lengths, self.indices, self.batch_size, self.seed, 0, self.world_size,
                                 self.rank))

    def load(self, indices: list[int]) -> FeatureBatch:
        raise NotImplementedError

    def iterate(self, epoch: int = 0, position: int = 0) -> Iterator[tuple[int, int, FeatureBatch]]:
        """Yields (epoch, index of the batch within the epoch, batch) forever, starting at (epoch, position)."""
        while True:
            batches = epoch_batches(self.lengths, self.indices, self.batch_size, self.seed, epoch,
                                    self.world_size, self.rank)
            for p in range(position, len(batches)):
                yield epoch, p, self.load(batches[p])
            epoch, position = epoch + 1, 0

    def once(self) -> Iterator[FeatureBatch]:
        """Each record exactly once, in order, in batches of ``batch_size`` (evaluation; ignores ranks)."""
        for s in range(0, len(self.indices), self.batch_size):
            yield self.load(self.indices[s : s + self.batch_size])


class OfflineFeatures(_Loader):
    """Batches read from a capture directory."""

    def __init__(self, store: FeatureStore, indices: Sequence[int], batch_size: int, seed: int = 0,
                 world_size: int = 1, rank: int = 0, want_aux: bool = True, max_len: int | None = None) -> None:
        super().__init__([min(n, max_len or n) for n in store.lengths], indices, batch_size, seed, world_size, rank)
        self.store, self.want_aux, self.max_len = store, want_aux, max_len

    def load(self, indices: list[int]) -> FeatureBatch:
        return self.store.batch(indices, self.want_aux, self.max_len)


class OnlineFeatures(_Loader):
    """Batches computed by running the target on the fly (no disk; Meta's online distillation)."""

    def __init__(self, model: Any, records: Sequence[PreparedRecord], indices: Sequence[int], batch_size: int,
                 hidden_indices: Sequence[int], seed: int = 0, world_size: int = 1, rank: int = 0,
                 max_len: int | None = None) -> None:
        if max_len is not None:
            records = [PreparedRecord(r.id, r.input_ids[:max_len], r.loss_mask[:max_len]) for r in records]
        super().__init__([len(r.input_ids) for r in records], indices, batch_size, seed, world_size, rank)
        self.model, self.records, self.hidden_indices = model, list(records), tuple(hidden_indices)

    def load(self, indices: list[int]) -> FeatureBatch:
        return capture_batch(self.model, [self.records[i] for i in indices], self.hidden_indices, indices)
