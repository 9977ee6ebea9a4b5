"""Our own forward pass for Llama-family decoders (Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2, Qwen3).

Weights come from an HF-named state dict; q/k/v and gate/up are fused at load time into one matmul each.
Every per-step input is an argument of ``Transformer.forward``: tokens, rotary positions, cache rows,
the block (tree) mask and which rows need logits. See docs/ARCHITECTURE.md for the contract.

Reusable pieces for draft heads: ``rms_norm`` / ``RMSNorm``, ``Rotary`` + ``apply_rotary``,
``plan_attention`` + ``cached_attention`` (attention of new tokens over a ``KVCache``), and ``decoder_layer``:
the one implementation of a decoder layer, run by the target's layers, the draft heads' layers and the
training-time unroll, each giving its own weights (``LayerWeights``) and where its keys live (``attend``).

Sliding-window attention (Mistral, Qwen with ``use_sliding_window``) is not implemented in the mask:
while the context fits in the window it is identical to full attention, and a forward that would make
a row longer than the window raises ``ContextOverflowError``.

Beyond docs/ARCHITECTURE.md: a query always sees its own slot (a padding node whose mask row is all
False stays finite), and ``block_mask`` may be [B, T, W] with W > T (the T new tokens are the last T of W
uncommitted block slots; the draft heads add tree levels this way).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Callable, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.kvcache import ContextOverflowError, HostRows, KVCache
from eaglespec.runtime.logits import rescored_logits
from eaglespec.runtime.quant import PackedLinear, linear

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_ROPE_TYPES",
    "AttentionPlan",
    "DecoderLayer",
    "ForwardOutput",
    "HostRows",
    "ModelArgs",
    "RMSNorm",
    "Rotary",
    "StateDictMismatchError",
    "Transformer",
    "UnsupportedModelError",
    "LayerWeights",
    "apply_rotary",
    "silu_mul",
    "attention",
    "cached_attention",
    "decoder_layer",
    "grouped_sdpa",
    "plan_attention",
    "rms_norm",
    "synchronize",
    "write_block",
]

SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(SUPPORTED_MODEL_TYPES.values())
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")

# Rotary tables are precomputed up to this many positions (or max_position_embeddings if smaller);
# positions beyond are computed on the fly. Keeps 128k-context configs from allocating ~100 MB.
ROPE_TABLE_MAX = 32768


class UnsupportedModelError(ValueError):
    """The config describes an architecture or feature this runtime does not implement."""


class StateDictMismatchError(ValueError):
    """Missing, unexpected or mis-shaped tensors in a state dict."""


def _unsupported(what: str) -> UnsupportedModelError:
    supported = ", ".join(f"{t} ({a})" for t, a in SUPPORTED_MODEL_TYPES.items())
    return UnsupportedModelError(
        f"{what}. Supported model types (architectures): {supported}; rope types: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


# ================================================================================================ config
@dataclass(frozen=True)
class ModelArgs:
    """Everything the forward needs from an HF config (field names follow HF)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rope_type: str = "default"  # "default" | "linear" | "llama3"
    rope_factor: float = 1.0  # linear / llama3 scaling factor
    rope_low_freq_factor: float = 1.0  # llama3 only
    rope_high_freq_factor: float = 4.0  # llama3 only
    rope_original_max_position: int = 8192  # llama3 only: pre-training context
    attention_bias: bool = False  # bias on q/k/v projections
    o_proj_bias: bool = False  # bias on the output projection (Llama/Qwen3 `attention_bias`, not Qwen2)
    mlp_bias: bool = False  # bias on gate/up/down
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # active attention window; contexts beyond it are refused

    @classmethod
    def from_hf_config(cls, cfg: Any) -> ModelArgs:
        """Build from a transformers config object or its dict (v5 ``rope_parameters`` or v4 ``rope_scaling``)."""
        d: dict[str, Any] = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
        model_type = d.get("model_type")
        archs = d.get("architectures") or []
        if not model_type:
            model_type = next((t for t, a in SUPPORTED_MODEL_TYPES.items() if a in archs), None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise _unsupported(f"unsupported model_type {model_type!r} (architectures {archs})")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise _unsupported(f"unsupported hidden_act {act!r} (only silu)")
        if float(d.get("partial_rotary_factor") or 1.0) != 1.0:
            raise _unsupported("partial rotary embeddings are not supported")

        hidden = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        kv_heads = int(d.get("num_key_value_heads") or heads)
        head_dim = int(d.get("head_dim") or hidden // heads)
        n_layers = int(d["num_hidden_layers"])
        max_pos = int(d.get("max_position_embeddings") or 2048)
        rope = _rope_fields(d, max_pos)
        bias = bool(d.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps") or 1e-6),
            max_position_embeddings=max_pos,
            attention_bias=True if model_type == "qwen2" else (bias and model_type != "mistral"),
            o_proj_bias=bias and model_type in ("llama", "qwen3"),
            mlp_bias=bool(d.get("mlp_bias", False)) and model_type == "llama",
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            sliding_window=_active_window(d, model_type, n_layers),
            **rope,
        )

    def replace(self, **changes: Any) -> ModelArgs:
        """A copy with some fields changed."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return ModelArgs(**values)


def _rope_fields(d: Mapping[str, Any], max_pos: int) -> dict[str, Any]:
    """RoPE settings from v5 ``rope_parameters`` or v4 ``rope_theta`` + ``rope_scaling``."""
    params = d.get("rope_parameters") or {}
    if params and "rope_type" not in params and "rope_theta" not in params:
        per_layer = list(params.values())  # per-layer-type dicts (e.g. {"full_attention": {...}})
        if not all(isinstance(p, Mapping) and p == per_layer[0] for p in per_layer):
            raise _unsupported("per-layer-type RoPE parameters are not supported")
        params = per_layer[0]
    params = {**(d.get("rope_scaling") or {}), **params}
    theta = float(params.get("rope_theta") or d.get("rope_theta") or 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise _unsupported(f"unsupported rope type {rope_type!r}")
    out: dict[str, Any] = {"rope_theta": theta, "rope_type": rope_type}
    if rope_type in ("linear", "llama3"):
        out["rope_factor"] = float(params["factor"])
    if rope_type == "llama3":
        out["rope_low_freq_factor"] = float(params["low_freq_factor"])
        out["rope_high_freq_factor"] = float(params["high_freq_factor"])
        out["rope_original_max_position"] = int(params.get("original_max_position_embeddings") or max_pos)
    return out


def _active_window(d: Mapping[str, Any], model_type: str, n_layers: int) -> int | None:
    """The sliding window if any layer uses one, else None."""
    window = d.get("sliding_window")
    if not window or model_type == "llama":
        return None
    layer_types = d.get("layer_types")
    if layer_types:
        unknown = set(layer_types) - {"full_attention", "sliding_attention"}
        if unknown:
            raise _unsupported(f"unsupported layer types {sorted(unknown)}")
        return int(window) if "sliding_attention" in layer_types else None
    if model_type == "mistral":
        return int(window)
    if d.get("use_sliding_window") and int(d.get("max_window_layers") or 0) < n_layers:
        return int(window)
    return None


# =========================================================================================== building blocks
def _eager_kernel(*tensors: Tensor) -> bool:
    """Whether our one-call CPU kernels (``cpu_kernels``) compute this step: float32 CPU tensors, the kernels
    loaded in this process, nothing that needs gradients, nothing being compiled (inductor fuses the same
    elementwise work itself)."""
    if not cpu_kernels.serves(*tensors) or torch.compiler.is_compiling():
        return False
    for t in tensors:  # a plain loop: asked for every norm, rotary and SwiGLU of a step
        if t.requires_grad:
            return False
    return True


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF-style RMSNorm: normalize in float32 over the last dim, cast back, then scale by ``weight``.

    ``weight`` broadcasts against ``x`` (e.g. ``[H]``, or ``[heads, D]`` for per-head norms). float32 rows on
    the CPU go through our one-call kernel (``kernels/rms_norm.cpp``) where it is loaded in this process and
    nothing needs gradients or is being compiled (inductor fuses the norm itself).
    """
    if weight.dim() == 1 and _eager_kernel(x, weight):
        return torch.ops.eaglespec.rms_norm(x, weight, eps)
    dtype = x.dtype
    y = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return weight * y.to(dtype)


class RMSNorm(nn.Module):
    """RMSNorm module wrapping ``rms_norm``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_inv_freq(args: ModelArgs) -> Tensor:
    """float32 ``[D/2]`` inverse frequencies, with linear / llama3 scaling applied (as HF computes them)."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if args.rope_type == "linear":
        inv_freq = inv_freq / args.rope_factor
    elif args.rope_type == "llama3":
        factor = args.rope_factor
        low, high = args.rope_low_freq_factor, args.rope_high_freq_factor
        old_ctx = args.rope_original_max_position
        low_freq_wavelen, high_freq_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


class Rotary(nn.Module):
    """Rotary embedding tables: ``cos`` and ``sin_signed`` float32 ``[P, D]``, indexed by positions.

    ``sin_signed = cat(-sin, sin)`` over the two halves, so that HF's ``x*cos + rotate_half(x)*sin``
    becomes ``x*cos + roll(x, D/2)*sin_signed`` (same products, same sums, one op fewer).
    """

    def __init__(self, args: ModelArgs, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.args = args
        self.register_buffer("inv_freq", torch.empty(0), persistent=False)  # [D/2]
        self.register_buffer("cos", torch.empty(0), persistent=False)  # [P, D]
        self.register_buffer("sin_signed", torch.empty(0), persistent=False)  # [P, D]
        self._build(torch.device(device) if device is not None else torch.device("cpu"))

    def _build(self, device: torch.device) -> None:
        self.inv_freq = rope_inv_freq(self.args).to(device)
        n = min(self.args.max_position_embeddings, ROPE_TABLE_MAX)
        self.cos, self.sin_signed = self._tables(torch.arange(n, device=device), self.inv_freq)

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - torch's signature
        # Module.to(dtype) / .half() would cast the tables; keep them float32, rebuilt on the new device.
        super()._apply(fn, recurse)
        self._build(self.cos.device)
        return self

    @staticmethod
    def _tables(positions: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions[..., None].float() * inv_freq  # [..., D/2]
        cos, sin = freqs.cos(), freqs.sin()
        return torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)

    def forward(self, positions: Tensor, dtype: torch.dtype, max_position: int | None = None) -> tuple[Tensor, Tensor]:
        """``(cos, sin_signed)`` as ``[B, T, 1, D]`` in ``dtype`` for int64 ``positions`` [B, T].

        ``max_position`` (a host int, if the caller knows it) avoids a device sync for the bounds check.
        """
        if max_position is None:
            max_position = int(positions.max()) if positions.numel() else 0
        b = self._buffers  # read directly: every forward asks (the target's and each draft step's)
        table_cos, table_sin = b["cos"], b["sin_signed"]
        if positions.device != table_cos.device:
            positions = positions.to(table_cos.device)
        if max_position < table_cos.shape[0]:
            cos, sin = table_cos[positions], table_sin[positions]  # [B, T, D]
        else:
            cos, sin = self._tables(positions, b["inv_freq"])
        if cos.dtype != dtype:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return cos.unsqueeze(2), sin.unsqueeze(2)


def apply_rotary(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """Rotate ``x`` [B, T, heads, D] with tables from ``Rotary`` ([B, T, 1, D]): float32 on the CPU in one
    kernel call (``kernels/layer_elementwise.cpp``) where ``_eager_kernel`` says so."""
    if x.dim() == 4 and _eager_kernel(x, cos, sin_signed):
        table = (x.shape[0], x.shape[1], 1, x.shape[3])
        return torch.ops.eaglespec.rotary(x, cos.expand(table), sin_signed.expand(table))
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """SwiGLU's ``silu(gate) * up`` ([..., I] each): float32 on the CPU in one kernel call
    (``kernels/layer_elementwise.cpp``) where ``_eager_kernel`` says so."""
    if _eager_kernel(gate, up) and gate.shape == up.shape:
        return torch.ops.eaglespec.silu_mul(gate, up)
    return F.silu(gate) * up


@dataclass
class AttentionPlan:
    """Per-forward attention bookkeeping, shared by all layers (built once by ``plan_attention``)."""

    rows: Tensor  # int64 [B] cache rows
    row_slice: slice | None  # the same rows as a slice when they are contiguous (views instead of gathers)
    write_slots: Tensor  # int64 [B, T] cache slots of the new tokens
    uniform_start: int | None  # the common first write slot when every row has the same prefix length
    n_slots: int  # S: attention runs over cache slots [0, S)
    mask: Tensor | None  # bool [B or 1, 1, T, S], True = may attend; None = see everything (or causal)
    is_causal: bool  # plain causal attention with no prefix (S == T)
    max_position: int | None  # host copy of positions.max(), when positions were given
    causal_mask: Tensor | None = None  # bool [1, 1, T, S] of an is_causal plan, built by the first layer that asks

    def explicit_mask(self, device: torch.device) -> Tensor | None:
        """``mask``, or for an ``is_causal`` plan the causal mask itself (top-left aligned, as
        scaled_dot_product_attention reads ``is_causal``), built once per forward, not once per layer."""
        if not self.is_causal:
            return self.mask
        if self.causal_mask is None:
            self.causal_mask = causal_mask(self.write_slots.shape[1], self.n_slots, device)
        return self.causal_mask


def causal_mask(n_new: int, n_slots: int, device: torch.device) -> Tensor:
    """bool [1, 1, T, S]: query t sees slots s <= t (top-left aligned, as scaled_dot_product_attention reads
    ``is_causal``)."""
    return torch.ones(n_new, n_slots, dtype=torch.bool, device=device).tril()[None, None]


def plan_attention(
    cache: KVCache,
    n_new: int,
    rows: Tensor | None = None,
    block_mask: Tensor | None = None,
    positions: Tensor | None = None,
    batch: int | None = None,
    host: HostRows | None = None,
) -> AttentionPlan:
    """Where the ``n_new`` tokens of each batch entry go and what every query may see.

    Query t of entry b sees cache slots ``[0, lengths[rows[b]])`` (the committed prefix), plus the block
    slots ``lengths[rows[b]] + j`` allowed by ``block_mask[b, t, j]`` (None = causal within the block),
    and always its own slot (so a padding query that sees nothing else is still well defined).

    ``block_mask`` may be wider than the new tokens: [B, T, W] with W >= T. The block is then W slots
    from ``lengths[rows[b]]``; the T new tokens are its LAST T (written at ``lengths + W - T + t``), the
    first W - T hold earlier uncommitted tokens (e.g. a draft tree's previous levels), visible only where
    the mask allows. W == T is the plain case.

    The attended length S is a shape, so it must be known on the host: from ``host`` (the rows and lengths
    the caller already holds; no device read, as in every decode step) or else from one host read of the
    lengths (prefill, tests). Raises ``ContextOverflowError`` if a row would pass ``cache.max_len``.
    ``positions`` (optional) only contributes its max to that read, for ``Rotary``; ``batch`` is needed when
    neither ``rows`` nor ``block_mask`` tells the batch size.
    """
    if batch is None:
        batch = rows.numel() if rows is not None else (block_mask.shape[0] if block_mask is not None else 1)
    idx = cache.rows_tensor(rows, batch)  # [B]
    width = n_new if block_mask is None else block_mask.shape[-1]  # W: block slots
    if width < n_new:
        raise ValueError(f"block_mask covers {width} block slots but there are {n_new} new tokens")
    offset = width - n_new  # block slots before the new tokens
    start = None  # [B] committed prefix per entry, read from the cache only where needed
    if host is not None:
        if len(host.rows) != batch or len(host.lengths) != batch:
            raise ValueError(f"host rows describe {len(host.rows)} rows and {len(host.lengths)} lengths, "
                             f"the forward has {batch}")
        max_start, min_start = max(host.lengths), min(host.lengths)
        first, contiguous = host.rows[0], all(b - a == 1 for a, b in zip(host.rows, host.rows[1:]))
        max_position = host.max_position if positions is not None else None
    else:
        start = cache.lengths[idx]  # [B] committed prefix per entry
        stats = [start.max(), start.min()]
        if rows is not None:
            stats += [idx[0], (idx.diff() == 1).all() if batch > 1
                      else torch.ones((), dtype=torch.bool, device=idx.device)]
        if positions is not None:
            stats.append(positions.max())
        read = torch.stack([s.to(device=idx.device, dtype=torch.int64) for s in stats]).tolist()
        max_start, min_start = read[0], read[1]
        first, contiguous = (read[2], bool(read[3])) if rows is not None else (0, True)
        max_position = read[-1] if positions is not None else None
    n_slots = max_start + width
    if n_slots > cache.max_len:
        raise cache.overflow_error(idx, width, batch) or ContextOverflowError("context overflow")
    row_slice = slice(0, batch) if rows is None else (slice(first, first + batch) if contiguous else None)
    uniform = max_start == min_start
    plain = uniform and offset == 0 and (n_new == 1 or block_mask is None)  # a mask from the host's numbers alone
    dev = cache.device
    if start is None and not plain:
        start = cache.lengths[idx]
    if uniform:  # every row starts at max_start (known on the host): no read of the lengths
        write_slots = torch.arange(max_start + offset, max_start + offset + n_new,
                                   device=dev).expand(batch, n_new).contiguous()  # [B, T]
    else:
        write_slots = start[:, None] + offset + torch.arange(n_new, device=dev)  # [B, T]

    mask, is_causal = None, False
    if plain:
        if n_new == 1:
            pass  # a single new token per row sees the whole prefix and itself: no mask
        elif max_start == 0:
            is_causal = True
        else:  # query t sees slots s <= t + max_start: the prefix, then causal within the block
            mask = torch.ones(n_new, n_slots, dtype=torch.bool, device=dev).tril_(max_start)[None, None]  # [1, 1, T, S]
    else:
        rel = torch.arange(n_slots, device=dev)[None, :] - start[:, None]  # [B, S] slot offset from the block
        in_block = (rel >= 0) & (rel < width)  # [B, S]
        j = rel.clamp(0, width - 1)[:, None, :]  # [B, 1, S] block column of each slot
        t = offset + torch.arange(n_new, device=dev)[None, :, None]  # [1, T, 1] block column of each query
        if block_mask is None:
            sees_block = j <= t  # [B, T, S]
        else:
            bm = block_mask.to(device=dev, dtype=torch.bool)
            sees_block = bm.gather(2, j.expand(batch, n_new, n_slots)) | (j == t)  # [B, T, S]
        mask = ((rel < 0)[:, None, :] | (in_block[:, None, :] & sees_block))[:, None]  # [B, 1, T, S]
    return AttentionPlan(
        rows=idx,
        row_slice=row_slice,
        write_slots=write_slots,
        uniform_start=max_start + offset if uniform else None,
        n_slots=n_slots,
        mask=mask,
        is_causal=is_causal,
        max_position=max_position,
    )


def write_block(dst: Tensor, new: Tensor, plan: AttentionPlan) -> None:
    """Write the new tokens' keys or values ``new [..., B, Hkv, T, D]`` into the cache tensor ``dst [...,
    max_batch, Hkv, max_len, D]`` (one layer, or all layers at once) at the slots ``plan`` assigns: a slice
    when the rows are contiguous with one common start, else one indexed write."""
    new = new.to(dst.dtype)  # a float16 cache under float32 activations: rounded to nearest even
    if plan.row_slice is not None and plan.uniform_start is not None:
        dst[..., plan.row_slice, :, plan.uniform_start:plan.uniform_start + new.shape[-2], :] = new
    else:  # rows [B, 1] against write_slots [B, T]: the indexed view is [B, T, ..., Hkv, D]
        dst[..., plan.rows[:, None], :, plan.write_slots, :] = new.movedim((-4, -2), (0, 1))


def cached_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cache: KVCache,
    layer: int,
    rows: Tensor | None = None,
    block_mask: Tensor | None = None,
    plan: AttentionPlan | None = None,
    compute_dtype: torch.dtype | None = None,
    exact_rows: bool = False,
) -> Tensor:
    """Write the new ``k``/``v`` into ``cache`` layer ``layer`` and attend ``q`` over prefix + block.

    Args:
        q: [B, T, H, D] rotated queries; k, v: [B, T, Hkv, D] (k rotated). H must be a multiple of Hkv.
        plan: from ``plan_attention`` (build it once per forward); if None it is built from rows/block_mask.
        compute_dtype: run the attention itself in this dtype (the output is cast back to the cache's).
            float64 makes the result independent of how many queries share the call, of padding and of the
            tree layout (see ``Transformer.attention_dtype``).
        exact_rows: run ``eaglespec::row_attention`` instead (float32, each query on its own: the same
            independence without the float64 copies; ``Transformer.row_attention``).
    Returns:
        [B, T, H * D] attention output (heads concatenated, ready for the output projection).
    """
    batch, n_new = q.shape[:2]
    if plan is None:
        plan = plan_attention(cache, n_new, rows, block_mask, batch=batch)
    k_layer, v_layer = cache.k[layer], cache.v[layer]  # [max_batch, Hkv, max_len, D]
    write_block(k_layer, k.transpose(1, 2), plan)
    write_block(v_layer, v.transpose(1, 2), plan)
    if plan.row_slice is not None:
        keys = k_layer[plan.row_slice, :, : plan.n_slots]  # [B, Hkv, S, D] view
        values = v_layer[plan.row_slice, :, : plan.n_slots]
    else:
        keys = k_layer[plan.rows, :, : plan.n_slots]  # [B, Hkv, S, D] gathered copy
        values = v_layer[plan.rows, :, : plan.n_slots]
    if exact_rows and plan.is_causal:  # the row kernel takes a mask, not is_causal: the plan's, built once a forward
        return attention(q, keys, values, plan.explicit_mask(q.device), False, compute_dtype, exact_rows)
    return attention(q, keys, values, plan.mask, plan.is_causal, compute_dtype, exact_rows)


def attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, is_causal: bool = False,
              compute_dtype: torch.dtype | None = None, exact_rows: bool = False) -> Tensor:
    """The attention kernel call: q [B, T, H, D] over keys, values [B, Hkv, S, D] (grouped heads), mask bool
    [B or 1, 1, T, S] (True = may attend) or None; computed in ``compute_dtype``, or by the row-independent
    float32 kernel with ``exact_rows`` (see ``cached_attention``; it reads float32 or float16 keys and values), and
    returned as [B, T, H * D] in q's dtype."""
    batch, n_new, n_heads, head_dim = q.shape
    if exact_rows and q.dtype == torch.float32 and keys.dtype in (torch.float32, torch.float16) and q.is_cpu:
        if is_causal:  # direct callers; cached_attention passes its plan's mask, built once a forward
            mask = causal_mask(n_new, keys.shape[2], q.device)
        out = torch.ops.eaglespec.row_attention(q.transpose(1, 2), keys, values, mask)  # [B, T, H, D]
        return out.reshape(batch, n_new, n_heads * head_dim)
    out_dtype = q.dtype
    compute_dtype = compute_dtype or q.dtype
    q, keys, values = q.to(compute_dtype), keys.to(compute_dtype), values.to(compute_dtype)  # no-ops where equal
    out = grouped_sdpa(q.transpose(1, 2), keys, values, mask, is_causal).to(out_dtype)  # [B, H, T, D]
    return out.transpose(1, 2).reshape(batch, n_new, n_heads * head_dim)


def synchronize(device: torch.device | str | None) -> None:
    """Wait for the device's queued kernels (CUDA launches are asynchronous); a no-op on the CPU. For timing."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def grouped_sdpa(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None,
                 is_causal: bool = False, fused_gqa: bool | None = None) -> Tensor:
    """``F.scaled_dot_product_attention`` with grouped heads: q [B, H, T, D] over keys, values [B, Hkv, S, D]
    (query head h reads kv head h // (H / Hkv)); mask bool, broadcastable to [B, H, T, S]. Returns [B, H, T, D].

    On CUDA only the flash kernel takes grouped heads (``enable_gqa``), and it runs half precision without a
    mask; anything else (float32, a tree or block mask) would fall back to the math kernel, which materialises
    the [B, H, T, S] scores (tens of GB for a batch of prompts). There, a mask shared by the heads folds each kv
    head's query group into the query rows (exact: rows are independent; no copy of the keys), and a causal
    forward gets the kv heads repeated; both then run the memory-efficient kernel. CPU keeps ``enable_gqa``.
    """
    n_heads, n_kv = q.shape[1], keys.shape[1]
    if fused_gqa is None:  # ``fused_gqa`` forces the choice (tests run the CUDA layout on the CPU)
        fused_gqa = q.device.type != "cuda" or (mask is None and q.dtype in (torch.float16, torch.bfloat16))
    if fused_gqa or n_heads == n_kv:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
    group = n_heads // n_kv
    if mask is not None and mask.dim() < 4:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if not is_causal and (mask is None or mask.shape[1] == 1):
        batch, _, n_q, head_dim = q.shape
        folded = q.reshape(batch, n_kv, group * n_q, head_dim)  # row g * T + t = query t of head kv * G + g
        mask = None if mask is None else mask.repeat(1, 1, group, 1)  # [B or 1, 1, G * T, S]
        out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask)
        return out.reshape(batch, n_heads, n_q, head_dim)
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=is_causal)


# ======================================================================================= the decoder layer
class LayerWeights(Protocol):
    """The weights of one decoder layer, as ``decoder_layer`` uses them (``prefill``: packed weights may pick
    their prompt kernel; other layers ignore it)."""

    n_heads: int  # query heads

    def attn_input(self, x: Tensor, emb: Tensor | None) -> Tensor:
        """[B, T, H] residual stream (and token embeddings, for layers that read them) -> attention input."""

    def project_qkv(self, a: Tensor, prefill: bool = False) -> tuple[Tensor, Tensor]:
        """Attention input -> (q and k [B, T, Hq + Hkv, D], normed but not rotated; v [B, T, Hkv, D])."""

    def project_out(self, o: Tensor, prefill: bool = False) -> Tensor:
        """Attention output [B, T, Hq * D] -> [B, T, H]."""

    def feed_forward(self, x: Tensor, prefill: bool = False) -> Tensor:
        """Residual stream [B, T, H] -> the MLP's contribution [B, T, H] (its pre-norm included)."""


Attend = Callable[[Tensor, Tensor, Tensor, int], Tensor]
"""attend(q [B, T, Hq, D], k, v [B, T, Hkv, D], layer index) -> [B, T, Hq * D]: stores the new keys and values
wherever this forward keeps them (a ``KVCache`` layer, a list during training) and attends over them."""


def decoder_layer(weights: LayerWeights, index: int, x: Tensor, rope: tuple[Tensor, Tensor], attend: Attend,
                  emb: Tensor | None = None, prefill: bool = False) -> Tensor:
    """One pre-norm decoder layer over the residual stream x [B, T, H]; returns the new stream.

    x += o_proj(attention(rotary(q), rotary(k), v)) from the layer's attention input, then x += mlp(norm(x)).
    The only implementation in the project: the target (``DecoderLayer``), the draft heads (``HeadLayer``)
    and training's unroll differ only in their weights and in ``attend``.
    """
    qk, v = weights.project_qkv(weights.attn_input(x, emb), prefill)
    qk = apply_rotary(qk, *rope)  # [B, T, Hq + Hkv, D]
    nh = weights.n_heads
    x = x + weights.project_out(attend(qk[:, :, :nh], qk[:, :, nh:], v, index), prefill)
    return x + weights.feed_forward(x, prefill)


# ================================================================================== the layer in one call
def layer_step_weights(attn_norm: Tensor, mlp_norm: Tensor, qkv: Sequence[Any], bqkv: Tensor | None, wo: Any,
                       bo: Tensor | None, gate_up: Sequence[Any], b13: Tensor | None, w2: Any, b2: Tensor | None
                       ) -> tuple | None:
    """The weights of one layer as ``eaglespec::layer_step`` (``kernels/layer_step.cpp``) takes them: the
    norms, then each projection as a w4a8 triple (wq, scale, offset) and its bias; ``qkv`` and ``gate_up``
    list the projections whose output rows are stacked (q, k, v; gate, up), which are concatenated here
    (each output row of a w4a8 weight is its own, so the stacked weight gives the same numbers). None
    unless every projection is a float32-in ``PackedLinear`` on our w4a8 kernel without a bias of its own."""
    def triple(layers: Sequence[Any]) -> list[Tensor] | None:
        if not all(isinstance(p, PackedLinear) and p.kernel == "w4a8" and p.bias is None for p in layers):
            return None
        parts = [[p.w4_q, p.w4_scale, p.w4_offset] for p in layers]
        return parts[0] if len(parts) == 1 else [torch.cat(ts) for ts in zip(*parts)]

    ws = (triple(qkv), triple((wo,)), triple(gate_up), triple((w2,)))
    if any(w is None for w in ws):
        return None
    return attn_norm, mlp_norm, ws[0], bqkv, ws[1], bo, ws[2], b13, ws[3], b2


def layer_step_table(dtype: torch.dtype, device: torch.device, layers: Iterable[tuple | None]) -> list[tuple] | None:
    """Per layer, the weights ``eaglespec::layer_step`` takes, or None unless the kernels are loaded, the layers
    compute in float32 on the CPU and every layer can run it. ``layers``: per layer, the arguments of
    ``layer_step_weights``, or None for a layer that cannot run it (read only once the rest qualifies)."""
    if not (cpu_kernels.loaded() and dtype == torch.float32 and device.type == "cpu"):
        return None
    steps = []
    for args in layers:
        weights = None if args is None else layer_step_weights(*args)
        if weights is None:
            return None
        steps.append(weights)
    return steps


def layer_steps_weights(steps: Sequence[tuple]) -> list[Tensor]:
    """The per-layer weights of ``layer_step_table`` as one flat list, as ``eaglespec::layer_steps`` (every layer
    in one call) takes them: per layer the two norms, then each projection's w4a8 triple and its bias (an empty
    tensor for none): 18 tensors a layer."""
    none = torch.empty(0)
    flat: list[Tensor] = []
    for attn_norm, mlp_norm, wqkv, bqkv, wo, bo, w13, b13, w2, b2 in steps:
        flat += [attn_norm, mlp_norm]
        for triple, bias in ((wqkv, bqkv), (wo, bo), (w13, b13), (w2, b2)):
            flat += [*triple, none if bias is None else bias]
    return flat


class LayerStepCall:
    """What every ``eaglespec::layer_step`` call of one forward shares (the attention plan, the rotary tables, the
    shapes); ``call(weights, x, cache, i, attn_input=None)`` runs layer i: the same numbers as ``decoder_layer``
    with ``cached_attention``'s row-independent attention."""

    def __init__(self, plan: AttentionPlan, n_new: int, rope: tuple[Tensor, Tensor], n_heads: int, n_kv_heads: int,
                 eps: float) -> None:
        self.plan, (self.cos, self.sin) = plan, rope
        self.mask = plan.mask
        if plan.is_causal:  # top-left aligned, as ``attention`` builds it for the kernel
            self.mask = torch.ones(n_new, plan.n_slots, dtype=torch.bool, device=self.cos.device).tril()[None, None]
        self.first = plan.row_slice.start if plan.row_slice is not None else -1
        self.shape = (n_heads, n_kv_heads, eps)

    def __call__(self, weights: tuple, x: Tensor, cache: KVCache, i: int, attn_input: Tensor | None = None) -> Tensor:
        p = self.plan
        return torch.ops.eaglespec.layer_step(x, attn_input, *weights, self.cos, self.sin, cache.k[i], cache.v[i],
                                              p.rows, p.write_slots, self.first, p.n_slots, self.mask, *self.shape)


# =============================================================================================== the model
class DecoderLayer(nn.Module):
    """The target's layer weights (``LayerWeights``), with fused q/k/v and gate/up projections."""

    def __init__(self, args: ModelArgs, dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__()
        h, d, nh, nkv, inter = (args.hidden_size, args.head_dim, args.num_attention_heads,
                                args.num_key_value_heads, args.intermediate_size)

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)

        self.n_heads, self.n_kv_heads, self.head_dim, self.eps = nh, nkv, d, args.rms_norm_eps
        self.attn_norm = param(h)
        self.wqkv = param((nh + 2 * nkv) * d, h)  # rows: q heads, then k heads, then v heads
        self.bqkv = param((nh + 2 * nkv) * d) if args.attention_bias else None
        self.qk_norm = param(nh + nkv, d) if args.qk_norm else None  # q_norm repeated per q head, then k_norm
        self.wo = param(h, nh * d)
        self.bo = param(h) if args.o_proj_bias else None
        self.mlp_norm = param(h)
        self.w13 = param(2 * inter, h)  # rows: gate, then up
        self.b13 = param(2 * inter) if args.mlp_bias else None
        self.w2 = param(h, inter)
        self.b2 = param(h) if args.mlp_bias else None

    def attn_input(self, x: Tensor, emb: Tensor | None = None) -> Tensor:
        return rms_norm(x, self.attn_norm, self.eps)

    def project_qkv(self, a: Tensor, prefill: bool = False) -> tuple[Tensor, Tensor]:
        batch, n_new, _ = a.shape
        nh, nkv = self.n_heads, self.n_kv_heads
        qkv = linear(a, self.wqkv, self.bqkv, prefill).view(batch, n_new, nh + 2 * nkv, self.head_dim)
        qk = qkv[:, :, : nh + nkv]  # [B, T, H + Hkv, D]
        if self.qk_norm is not None:
            qk = rms_norm(qk, self.qk_norm, self.eps)
        return qk, qkv[:, :, nh + nkv:]

    def project_out(self, o: Tensor, prefill: bool = False) -> Tensor:
        return linear(o, self.wo, self.bo, prefill)

    def feed_forward(self, x: Tensor, prefill: bool = False) -> Tensor:
        gate, up = linear(rms_norm(x, self.mlp_norm, self.eps), self.w13, self.b13, prefill).chunk(2, dim=-1)
        return linear(silu_mul(gate, up), self.w2, self.b2, prefill)


@dataclass
class ForwardOutput:
    hidden: Tensor  # [B, T, H] final-normed hidden states (what lm_head consumes; EAGLE-1 feature)
    aux: Tensor | None  # [B, T, len(hidden_indices) * H] pre-norm residual streams, or None
    logits: Tensor | None  # float32 [B, K, V], or None


class Transformer(nn.Module):
    """Llama-family decoder running on a ``KVCache``; build with ``Transformer.from_state_dict``."""

    def __init__(self, args: ModelArgs, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(
            args.vocab_size, args.hidden_size,
            _weight=torch.empty(args.vocab_size, args.hidden_size, dtype=dtype, device=device), _freeze=True)
        self.layers = nn.ModuleList(DecoderLayer(args, dtype, device) for _ in range(args.num_hidden_layers))
        self.norm = nn.Parameter(torch.empty(args.hidden_size, dtype=dtype, device=device), requires_grad=False)
        if args.tie_word_embeddings:
            self.lm_head_weight = self.embed_tokens.weight  # [V, H], shared
        else:
            self.lm_head_weight = nn.Parameter(torch.empty(args.vocab_size, args.hidden_size, dtype=dtype,
                                                           device=device), requires_grad=False)
        self.rotary = Rotary(args, device=device)
        self.lm_head_packed: PackedLinear | None = None  # set by runtime.pack.pack_model
        # The dtype attention computes in (None = the model's). runtime.pack.pack_model sets float64: the packed
        # kernels round their inputs to bfloat16, which turns a last-bit difference in float32 attention (the
        # blocked kernel sums in another order for 4 queries than for 1, around masked slots, ...) into a
        # different activation, and greedy speculative output then drifted from vanilla output within 6-50
        # tokens on the default model. Attention in float64 rounded to float32 gives the same float32 for each
        # query however it was batched (measured: 30 of 30 verified tokens bit-identical to decoding them one
        # by one, vs 3 of 30 in float32), for +3% of a decode step and +17% of a 16-token verification after
        # 256 tokens (the float64 copy of the cached keys and values grows with the context).
        self.attention_dtype: torch.dtype | None = None
        # Forwards attend with eaglespec::row_attention instead (float32, each query computed on its own in a
        # fixed order: the same independence without float64 copies; set by runtime.pack.pack_model where
        # runtime.cpu_kernels are available). Until session 22 prompt forwards kept the float64 above.
        self.row_attention = False
        # Decode and verification forwards as one compiled graph (runtime.compiled.compile_step), or None.
        self.step_graph: Any = None
        # Per layer, the tensors eaglespec::layer_step takes (kernels/layer_step.cpp: the layer in one call,
        # bit-identical to decoder_layer), for the eager decode and verification forwards of a w4a8-packed model;
        # set by runtime.pack.pack_model (``layer_step_args``), dropped when the weights move (``_apply``).
        self.layer_steps: list[tuple] | None = None
        self._steps_flat: tuple[list[tuple], list[Tensor]] | None = None  # layer_steps_weights(layer_steps)
        self.precision = "float32" if dtype == torch.float32 else str(dtype).removeprefix("torch.")
        self.int4_kernel: str | None = None  # packed int4: "w4a8" or "torch" (runtime.quant.INT4_KERNELS)
        # The dtype prompt rows are multiplied in: the model's own, or for packed models the dense copy's
        # (runtime.quant.PROMPT_DTYPES; set by runtime.pack.pack_model).
        self.prompt_dtype = str(dtype).removeprefix("torch.")
        # The KV cache's dtype (``new_cache``): the model's, or float16 where eaglespec::row_attention reads it
        # (``runtime.loading.resolve_kv_dtype``; set by ``load_target``).
        self.kv_dtype: torch.dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - torch's signature
        self.layer_steps = self._steps_flat = None  # they hold the old tensors
        return super()._apply(fn, recurse)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    # ------------------------------------------------------------------------------------------ loading
    @staticmethod
    def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
        """HF tensor names and shapes a checkpoint of ``args`` must contain (no more, no fewer)."""
        h, d, inter, v = args.hidden_size, args.head_dim, args.intermediate_size, args.vocab_size
        q, kv = args.num_attention_heads * d, args.num_key_value_heads * d
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
        if not args.tie_word_embeddings:
            shapes["lm_head.weight"] = (v, h)
        for i in range(args.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (inter, h),
                p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter),
            }
            if args.attention_bias:
                shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)}
            if args.o_proj_bias:
                shapes[p + "self_attn.o_proj.bias"] = (h,)
            if args.mlp_bias:
                shapes |= {p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                           p + "mlp.down_proj.bias": (h,)}
            if args.qk_norm:
                shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        return shapes

    @classmethod
    def from_state_dict(cls, args: ModelArgs, state_dict: Mapping[str, Tensor],
                        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Transformer:
        """Build from HF-named weights, strictly: any missing, unexpected or mis-shaped tensor is an error.

        Tolerated extras: ``lm_head.weight`` of a tied model when it equals the embedding (HF's
        ``state_dict()`` lists it), and derived ``rotary_emb.inv_freq`` buffers.
        """
        sd = dict(state_dict)
        expected = cls.expected_shapes(args)
        for name in [n for n in sd if n.endswith("rotary_emb.inv_freq")]:
            del sd[name]
        if args.tie_word_embeddings and "lm_head.weight" in sd and "model.embed_tokens.weight" in sd:
            if not torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"]):
                raise StateDictMismatchError(
                    "tie_word_embeddings is set but lm_head.weight differs from model.embed_tokens.weight")
            del sd["lm_head.weight"]
        missing = sorted(set(expected) - set(sd))
        unexpected = sorted(set(sd) - set(expected))
        misshaped = [f"{n}: got {tuple(sd[n].shape)}, expected {s}" for n, s in expected.items()
                     if n in sd and tuple(sd[n].shape) != s]
        if missing or unexpected or misshaped:
            parts = [f"{label} ({len(items)}): {', '.join(items[:20])}{' ...' if len(items) > 20 else ''}"
                     for label, items in (("missing", missing), ("unexpected", unexpected),
                                          ("mis-shaped", misshaped)) if items]
            raise StateDictMismatchError(f"state dict does not match {args.model_type} config: " + "; ".join(parts))

        model = cls(args, dtype=dtype, device=device)
        with torch.no_grad():
            def put(dst: Tensor, *names: str) -> None:
                dst.copy_(torch.cat([sd[n].reshape(-1) for n in names]).view(dst.shape))

            put(model.embed_tokens.weight, "model.embed_tokens.weight")
            put(model.norm, "model.norm.weight")
            if not args.tie_word_embeddings:
                put(model.lm_head_weight, "lm_head.weight")
            for i, layer in enumerate(model.layers):
                p = f"model.layers.{i}."
                a, m = p + "self_attn.", p + "mlp."
                put(layer.attn_norm, p + "input_layernorm.weight")
                put(layer.mlp_norm, p + "post_attention_layernorm.weight")
                put(layer.wqkv, a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
                put(layer.wo, a + "o_proj.weight")
                put(layer.w13, m + "gate_proj.weight", m + "up_proj.weight")
                put(layer.w2, m + "down_proj.weight")
                if layer.bqkv is not None:
                    put(layer.bqkv, a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias")
                if layer.bo is not None:
                    put(layer.bo, a + "o_proj.bias")
                if layer.b13 is not None:
                    put(layer.b13, m + "gate_proj.bias", m + "up_proj.bias")
                    put(layer.b2, m + "down_proj.bias")
                if layer.qk_norm is not None:
                    qn, kn = sd[a + "q_norm.weight"], sd[a + "k_norm.weight"]
                    layer.qk_norm.copy_(torch.cat([qn.expand(args.num_attention_heads, -1),
                                                   kn.expand(args.num_key_value_heads, -1)]))
        return model

    def new_cache(self, max_batch: int, max_len: int) -> KVCache:
        """An empty cache sized for this model, in its dtype and on its device."""
        a = self.args
        return KVCache(a.num_hidden_layers, max_batch, a.num_key_value_heads, max_len, a.head_dim,
                       dtype=self.kv_dtype, device=self.device)

    # ------------------------------------------------------------------------------------------ forward
    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: KVCache,
        rows: Tensor | None = None,
        block_mask: Tensor | None = None,
        logits_at: Tensor | Literal["all"] | None = None,
        hidden_indices: Sequence[int] = (),
        prefill: bool = False,
        host: HostRows | None = None,
        eager: bool = False,
    ) -> ForwardOutput:
        """Run T new tokens per batch entry over the cache (see docs/ARCHITECTURE.md).

        Decode and verification forwards go to ``step_graph`` when one is installed and handles them
        (``runtime.compiled``), unless ``eager``; everything else runs here in eager PyTorch.

        Args:
            tokens: int64 [B, T]; positions: int64 [B, T] rotary positions.
            cache: K/V of the new tokens is written at slots ``lengths[rows[b]] + t``; lengths are not moved.
            rows: int64 [B] cache rows (None = ``arange(B)``).
            block_mask: bool [B, T, W >= T], new token i may see block slot j (None = causal); the new
                tokens are the last T of the W block slots. The committed prefix and the token itself are
                always visible.
            logits_at: None (no logits), "all", or int64 [B, K] block indices.
            hidden_indices: HF ``hidden_states`` indices (0 = embeddings, i = residual after layer i-1).
            prefill: a prompt forward (packed weights may use their measured prompt kernel; decode and
                verification forwards always use the packed one, so greedy identity holds).
            host: the rows' committed lengths as the caller holds them on the host (``plan_attention``):
                the forward then reads nothing back from the device.
        """
        batch, n_new = tokens.shape
        n_layers = self.args.num_hidden_layers
        bad = [i for i in hidden_indices if not 0 <= i <= n_layers]
        if bad:
            raise ValueError(f"hidden_indices {bad} out of range [0, {n_layers}]")
        step = self.step_graph
        if step is not None and not (prefill or eager) and step.handles(n_new, block_mask, logits_at):
            return step(tokens, positions, cache, rows=rows, block_mask=block_mask, logits_at=logits_at,
                        hidden_indices=hidden_indices, host=host)
        plan = plan_attention(cache, n_new, rows, block_mask, positions=positions, batch=batch, host=host)
        window = self.args.sliding_window
        if window is not None and plan.n_slots > window:
            raise cache.overflow_error(plan.rows, n_new, batch, limit=window, what="the sliding window") \
                or ContextOverflowError(f"context longer than the sliding window ({window})")

        rope = self.rotary(positions, self.dtype, plan.max_position)
        x = self.embed_tokens(tokens)  # [B, T, H]
        wanted = set(hidden_indices)
        saved: dict[int, Tensor] = {0: x} if 0 in wanted else {}

        # prompts too since session 22: 3.6x faster than the float64 flash kernel over a 1000-token prompt (11 vs
        # 41 ms a layer on a 2-core EPYC), and a prompt's attention then does not depend on how it was batched
        exact_rows = self.row_attention
        one_call = not prefill and self.layer_steps is not None and x.is_cpu  # the packed layer kernel: decode only
        aux = None
        if exact_rows and one_call and not torch.compiler.is_compiling():
            x, aux = self._layer_steps(x, rope, cache, plan, hidden_indices, saved)
        else:
            def attend(q: Tensor, k: Tensor, v: Tensor, i: int) -> Tensor:
                return cached_attention(q, k, v, cache, i, plan=plan, compute_dtype=self.attention_dtype,
                                        exact_rows=exact_rows)

            for i, layer in enumerate(self.layers):
                x = decoder_layer(layer, i, x, rope, attend, prefill=prefill)
                if i + 1 in wanted:
                    saved[i + 1] = x
        hidden = rms_norm(x, self.norm, self.args.rms_norm_eps)  # [B, T, H]
        if aux is None and hidden_indices:
            aux = torch.cat([saved[i] for i in hidden_indices], dim=-1)

        logits = None
        if logits_at is not None:
            if isinstance(logits_at, str):
                if logits_at != "all":
                    raise ValueError(f"logits_at must be None, 'all' or an index tensor, got {logits_at!r}")
                picked = hidden
            else:
                idx = logits_at.to(device=hidden.device, dtype=torch.int64)  # [B, K]
                picked = hidden.gather(1, idx[:, :, None].expand(-1, -1, hidden.shape[-1]))  # [B, K, H]
            logits = self.output_logits(picked, prefill)  # [B, K, V]
        return ForwardOutput(hidden=hidden, aux=aux, logits=logits)

    def _layer_steps(self, x: Tensor, rope: tuple[Tensor, Tensor], cache: KVCache, plan: AttentionPlan,
                     hidden_indices: Sequence[int], saved: dict[int, Tensor]) -> tuple[Tensor, Tensor | None]:
        """The layers (``layer_steps``) in one ``eaglespec::layer_steps`` call, each as ``eaglespec::layer_step``
        computes it: what ``decoder_layer`` computes with ``cached_attention``'s row-independent attention, bit
        for bit. Returns the last layer's residual stream and the ``aux`` of ``hidden_indices``: the kernel
        writes the kept layers' outputs side by side (None when none is wanted; with the embeddings among them,
        index 0, the layers' parts go to ``saved`` and the caller concatenates)."""
        a = self.args
        call = LayerStepCall(plan, x.shape[1], rope, a.num_attention_heads, a.num_key_value_heads, a.rms_norm_eps)
        if self._steps_flat is None or self._steps_flat[0] is not self.layer_steps:  # built once per layer_steps
            self._steps_flat = (self.layer_steps, layer_steps_weights(self.layer_steps))
        keep = [i for i in hidden_indices if i >= 1]
        p = plan
        outs = torch.ops.eaglespec.layer_steps(x, self._steps_flat[1], call.cos, call.sin, cache.k, cache.v, p.rows,
                                               p.write_slots, call.first, p.n_slots, call.mask, *call.shape,
                                               [i - 1 for i in keep])
        if not keep or len(keep) == len(hidden_indices):
            return outs[0], outs[1] if keep else None
        saved.update(zip(keep, outs[1].split(x.shape[-1], dim=-1)))
        return outs[0], None

    def layer_step_args(self) -> list[tuple] | None:
        """Per layer, the weights ``eaglespec::layer_step`` takes (``layer_step_table``; layers with q/k norms
        cannot), or None (``runtime.pack.pack_model`` installs them as ``layer_steps``)."""
        return layer_step_table(self.dtype, self.device, (
            None if l.qk_norm is not None else
            (l.attn_norm, l.mlp_norm, (l.wqkv,), l.bqkv, l.wo, l.bo, (l.w13,), l.b13, l.w2, l.b2) for l in self.layers))

    def output_logits(self, hidden: Tensor, prefill: bool = False) -> Tensor:
        """float32 logits [..., V] of final-normed ``hidden`` [..., H].

        float32 models: the exact projection. Packed (int8 / int4 lm_head) and bfloat16 models: the fast projection
        ranks the vocabulary and its best candidates are rescored in float32 (``logits.rescored_logits``), so
        greedy choices do not hang on bfloat16 ties.
        """
        if self.lm_head_packed is not None:
            return rescored_logits(hidden, lambda h: self.lm_head_packed(h, prefill), self.lm_head_weight)
        if self.dtype != torch.float32:
            return rescored_logits(hidden, lambda h: F.linear(h, self.lm_head_weight), self.lm_head_weight)
        return F.linear(hidden, self.lm_head_weight).float()
