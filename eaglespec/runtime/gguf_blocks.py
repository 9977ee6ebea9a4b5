"""GGUF tensors in their own format: Q4_0 / Q4_1 blocks as int4 values with group scales and zero points,
Q8_0 blocks as int8 values with group scales, F32 / F16 / BF16 as they are, without a float32 round trip.

Block layouts (ggml, 32 weights per block along the input dimension, little-endian):
  * Q4_0: fp16 d, 16 bytes of nibbles; w = d * (q - 8).
  * Q4_1: fp16 d, fp16 m, 16 bytes of nibbles; w = d * q + m.
  * Q8_0: fp16 d, 32 int8; w = d * q.
In each nibble byte j the low nibble is weight j and the high nibble weight j + 16.

Llama q/k projections are stored by llama.cpp's converter with the rows of each head permuted for its
rotary layout; ``unpermute_rows`` restores the Hugging Face order (rows are whole blocks, so the quantized
values and their scales move together and stay exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["BLOCK", "GGUFFileError", "GGUFTypeError", "check_gguf", "native_precision", "open_reader", "QuantTensor",
           "read_quant_tensors", "unpermute_rows"]

BLOCK = 32
NATIVE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


def open_reader(path: str | Path):
    """The ``gguf.GGUFReader`` of a file, parsed once per process while the file is unchanged: parsing the
    header of the default model (272 tensors and a 49K-entry vocabulary, in Python) takes ~4 s on a 2-core EPYC,
    and one load checked the file, chose its precision and read its blocks with three parses."""
    st = Path(path).stat()
    return _cached_reader(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=4)
def _cached_reader(path: str, size: int, mtime_ns: int):
    from gguf import GGUFReader

    return GGUFReader(path)


class GGUFTypeError(ValueError):
    """A GGUF tensor type this runtime does not read in its own format."""


class GGUFFileError(ValueError):
    """A truncated or corrupt GGUF file."""


@dataclass
class QuantTensor:
    """One 2-D GGUF tensor [N, K] (rows = output features) in its own format.

    kind "int4": q int32 [N, K] in 0..15, scale/zero float32 [N, K/32] with w = (q - 8) * scale + zero.
    kind "int8": q int8 [N, K], scale float32 [N, K/32] with w = q * scale (per block).
    kind "float": dense float32 [N, K] (from F32 / F16 / BF16)."""

    name: str
    ggml_type: str
    kind: str
    q: Tensor | None = None
    scale: Tensor | None = None
    zero: Tensor | None = None
    dense: Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        t = self.dense if self.kind == "float" else self.q
        return tuple(t.shape)

    def dequantize(self) -> Tensor:
        """float32 [N, K], exactly what the blocks encode (fp16 scales, float32 arithmetic)."""
        if self.kind == "float":
            return self.dense
        n, k = self.q.shape
        qg = self.q.float().reshape(n, k // BLOCK, BLOCK)
        if self.kind == "int8":
            return (qg * self.scale[..., None]).reshape(n, k)
        return ((qg - 8.0) * self.scale[..., None] + self.zero[..., None]).reshape(n, k)

    def select_rows(self, index: Tensor) -> QuantTensor:
        pick = (lambda t: None if t is None else t[index].contiguous())
        return QuantTensor(self.name, self.ggml_type, self.kind, pick(self.q), pick(self.scale), pick(self.zero),
                           pick(self.dense))


def _decode(name: str, type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> QuantTensor:
    if type_name in ("F32", "F16", "BF16"):
        if type_name == "BF16":
            dense = torch.from_numpy(np.ascontiguousarray(raw).view(np.int16).copy()).view(torch.bfloat16).float()
        else:
            dense = torch.from_numpy(np.array(raw, dtype=np.float32))
        return QuantTensor(name, type_name, "float", dense=dense.reshape(shape))
    n = raw.shape[0]
    k = shape[1]
    nb = k // BLOCK
    blocks = np.ascontiguousarray(raw).reshape(n, nb, -1)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))  # [N, nb]
    if type_name == "Q8_0":
        q = torch.from_numpy(blocks[..., 2:34].copy().view(np.int8)).reshape(n, k)
        return QuantTensor(name, type_name, "int8", q=q, scale=d)
    if type_name == "Q4_0":
        qs, m = blocks[..., 2:18], None
    else:  # Q4_1
        m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
        qs = blocks[..., 4:20]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [N, nb, 32]: low nibbles first
    q = torch.from_numpy(nib.astype(np.int32)).reshape(n, k)
    zero = torch.zeros_like(d) if m is None else m + 8.0 * d
    return QuantTensor(name, type_name, "int4", q=q, scale=d, zero=zero)


def read_quant_tensors(path: str | Path, names: list[str] | None = None) -> dict[str, QuantTensor]:
    """The 2-D tensors of a GGUF file (or those in ``names``) in their own format. A tensor of another type
    is refused with a ``GGUFTypeError`` naming the tensor and its type."""
    check_gguf(path)
    reader = open_reader(path)
    out: dict[str, QuantTensor] = {}
    for t in reader.tensors:
        if names is not None and t.name not in names:
            continue
        type_name = t.tensor_type.name
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))  # GGUF lists dims innermost first
        if len(shape) != 2:
            continue
        if type_name not in NATIVE_TYPES:
            raise GGUFTypeError(
                f"{path}: tensor {t.name} has GGUF type {type_name}, which the native-precision runtime does not "
                f"read (supported: {', '.join(NATIVE_TYPES)}); load it with --dtype float32 (dequantized) instead")
        if type_name.startswith("Q") and shape[1] % BLOCK:
            raise GGUFTypeError(f"{path}: tensor {t.name}: {shape[1]} columns is not a multiple of {BLOCK}")
        out[t.name] = _decode(t.name, type_name, t.data, shape)
    return out


PRECISION_OF_TYPE = {"Q4_0": "int4", "Q4_1": "int4", "Q8_0": "int8"}
"""The packed precision that runs a GGUF weight type as it is stored (other native types run in float32)."""
_PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def native_precision(path: str | Path) -> tuple[str, str]:
    """(precision, why): the precision that runs this GGUF's layer projections in the format they are stored in
    (``--dtype auto``). "int4" when most are Q4_0/Q4_1, "int8" when most are Q8_0, else "float32" (dequantized):
    float files, and files holding any 2-D tensor type this runtime does not read natively (e.g. Q4_K)."""
    from collections import Counter

    reader = open_reader(path)
    types: Counter[str] = Counter()
    for t in reader.tensors:
        type_name = t.tensor_type.name
        if len(t.shape) == 2 and type_name not in NATIVE_TYPES:
            return "float32", f"tensor {t.name} is {type_name}, which only the dequantized float32 path reads"
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in _PROJECTIONS:
            types[type_name] += 1
    if not types:
        return "float32", "no layer projections found"
    common, count = types.most_common(1)[0]
    precision = PRECISION_OF_TYPE.get(common, "float32")
    return precision, f"{count} of {sum(types.values())} layer projections are {common}"


def unpermute_rows(n_rows: int, n_head: int) -> Tensor:
    """Row index that turns llama.cpp's q/k row order back into Hugging Face's (per head: interleaved halves
    -> rotate-half layout)."""
    dim = n_rows // n_head // 2
    return torch.arange(n_rows).reshape(n_head, dim, 2).transpose(1, 2).reshape(n_rows)


def check_gguf(gguf_path: str | Path) -> None:
    """Refuse a truncated or corrupt GGUF file (unreadable header, tensor data past the end of the file, NaN/inf
    in its float tensors) with a GGUFFileError naming the file, before any slow conversion."""
    gguf_path = Path(gguf_path)
    size = gguf_path.stat().st_size
    try:
        reader = open_reader(gguf_path)
        tensors = list(reader.tensors)
    except Exception as e:  # gguf raises ValueError, IndexError, struct errors, ... on a damaged header
        raise GGUFFileError(f"{gguf_path}: unreadable GGUF file, truncated or corrupt ({type(e).__name__}: {e})") \
            from None
    for t in tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or t.data.nbytes != int(t.n_bytes):
            raise GGUFFileError(f"{gguf_path}: truncated GGUF file: tensor {t.name} needs bytes up to {end} but the "
                                 f"file has {size}")
        if t.tensor_type.name in ("F32", "F16") and not np.isfinite(t.data).all():
            raise GGUFFileError(f"{gguf_path}: tensor {t.name} holds non-finite values (NaN/inf)")
