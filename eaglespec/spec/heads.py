"""EAGLE draft heads: EAGLE-1/2 and EAGLE-3 modules, and strict save/load in the engine layouts.

A head autoregresses on the target's features. One draft step takes the feature ``h`` of position i and
the token at i+1 and returns the predicted feature of position i+1 (the "recurrent feature" fed to the
next step), from which ``logits`` gives the draft distribution of the token at i+2:

    h = head.fuse(head.target_feature(target_out))     # [B, T, H] from the target's forward
    out = head(h, tokens, positions, cache)            # [B, T, H] pre-norm output feature
    q = softmax(head.logits(out)); ids = head.to_target_ids(draft_ids)

EAGLE-1/2 (``kind="eagle1"``): feature = the target's final-normed hidden state (``out.hidden``);
``x = fc(cat(embed(token), h))`` enters decoder layers whose FIRST layer has no input norm; the output
goes through the target's (shared, frozen) lm_head.

EAGLE-3 (``kind="eagle3"``): feature = three pre-norm residual streams of the target concatenated
[low | mid | high] (``out.aux``), fused by ``fc`` into H. The first layer attends over
``cat(input_layernorm(embed(token)), hidden_norm(h))`` (embedding first, 2H wide) with the raw ``h`` as
residual; later layers are standard Llama layers; ``norm`` + an own ``lm_head`` over a draft vocabulary
whose ids map to target ids through ``d2t`` offsets.

The embedding table (and for EAGLE-1 the lm_head) belong to the target: the head holds them as
non-persistent buffers, so they are neither trained (not in ``parameters()``) nor saved.

The decoder layers run the target runtime's one ``decoder_layer`` (with ``Rotary``, ``plan_attention``/
``cached_attention`` on a ``KVCache``); a ``HeadLayer`` only holds the weights, plain trainable ``nn.Linear``s
named as on disk, so ``head.state_dict()`` is exactly the saved tensor set.

Feature layer ids are stored in our convention, ``"hf_hidden_states_index"``: id i is HF
``output_hidden_states[i]`` = the residual stream after layer i-1 = the input of layer i (0 = embeddings;
layers 0-based). vLLM's ``eagle_aux_hidden_state_layer_ids`` mean "input of layer k": the same numbers.
SpecForge and ModelOpt count "output of layer k": k = i - 1. See ``feature_ids_to_hf``.

On-disk layouts (config.json + model.safetensors):
  * EAGLE-1: ``fc.weight`` [H, 2H] (+ ``fc.bias`` iff config ``bias``), ``layers.0.*`` without
    ``input_layernorm``, extra layers ``layers.{i}.*`` (standard); architectures ["EagleLlamaForCausalLM"].
  * EAGLE-3 (SpecForge/SGLang, what we write): ``fc.weight``, ``midlayer.*`` (first layer),
    ``layers.{i}.*`` for extra layers i = 1..N-1 (numbered as in vLLM, which loads ``midlayer`` as layer 0),
    ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``; architectures ["LlamaForCausalLMEagle3"].
  * EAGLE-3 (vllm-project/speculators, read only): same tensors with ``layers.0.*`` for the first layer
    and a config with ``speculators_model_type: eagle3`` and a nested ``transformer_layer_config``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eaglespec.runtime.kvcache import HostRows, KVCache
from eaglespec.runtime.quant import PackedLinear
from eaglespec.runtime.model import (
    ForwardOutput,
    LayerStepCall,
    ModelArgs,
    RMSNorm,
    Rotary,
    Transformer,
    UnsupportedModelError,
    cached_attention,
    decoder_layer,
    layer_step_table,
    plan_attention,
    silu_mul,
)

__all__ = [
    "FEATURE_LAYER_CONVENTIONS",
    "DraftHead",
    "HeadConfig",
    "HeadKind",
    "HeadLoadError",
    "default_feature_layer_ids",
    "draft_vocab_maps",
    "feature_ids_to_hf",
    "load_head",
    "save_head",
]

HeadKind = Literal["eagle1", "eagle3"]

# How each convention's layer id k relates to our HF hidden_states index i: i = k + offset.
FEATURE_LAYER_CONVENTIONS: dict[str, int] = {
    "hf_hidden_states_index": 0,  # ours: HF output_hidden_states[i]; 0 = embeddings
    "input_of_layer": 0,  # vLLM eagle_aux_hidden_state_layer_ids: captured before layer k runs
    "output_of_layer": 1,  # SpecForge / ModelOpt: the residual stream after layer k
}
OUR_CONVENTION = "hf_hidden_states_index"

EAGLE1_ARCHITECTURES = ("EagleLlamaForCausalLM", "LlamaForCausalLM")  # ours first; the reference writes the 2nd
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # SpecForge/SGLang, vLLM's name
SPECULATORS_EAGLE3_ARCHITECTURE = "Eagle3Speculator"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
FORMAT_VERSION = 1


class HeadLoadError(ValueError):
    """A head directory that cannot be loaded exactly (the message names the file, tensor or flag)."""


def feature_ids_to_hf(ids: Sequence[int], convention: str) -> tuple[int, ...]:
    """Convert feature layer ids from ``convention`` (see ``FEATURE_LAYER_CONVENTIONS``) to ours."""
    if convention not in FEATURE_LAYER_CONVENTIONS:
        raise ValueError(f"unknown feature layer convention {convention!r}; known: {sorted(FEATURE_LAYER_CONVENTIONS)}")
    return tuple(int(i) + FEATURE_LAYER_CONVENTIONS[convention] for i in ids)


def default_feature_layer_ids(n_layers: int) -> tuple[int, ...]:
    """EAGLE-3's (2, L//2, L-3) in HF hidden_states indices, or three distinct spread-out ids when L is too
    shallow for those to be distinct and increasing (they collide for L < 7, e.g. (2, 2, 1) at L = 4)."""
    ids = (2, n_layers // 2, n_layers - 3)
    if ids[0] < ids[1] < ids[2]:
        return ids
    if n_layers < 2:
        raise ValueError(f"a {n_layers}-layer target has fewer than 3 distinct feature layers")
    lo = 1 if n_layers >= 4 else 0  # skip the raw embeddings when there is room
    hi = n_layers - 1 if n_layers >= 4 else n_layers
    return (lo, round((lo + hi) / 2), hi)


def _rope_scaling(args: ModelArgs) -> dict[str, Any] | None:
    """The HF ``rope_scaling`` dict that reproduces ``args``' RoPE (None for plain RoPE)."""
    if args.rope_type == "default":
        return None
    out: dict[str, Any] = {"rope_type": args.rope_type, "factor": args.rope_factor}
    if args.rope_type == "llama3":
        out |= {"low_freq_factor": args.rope_low_freq_factor, "high_freq_factor": args.rope_high_freq_factor,
                "original_max_position_embeddings": args.rope_original_max_position}
    return out


# ================================================================================================ config
@dataclass(frozen=True)
class HeadConfig:
    """Shape and semantics of a draft head (the engine config.json holds the same facts)."""

    kind: HeadKind
    """"eagle1" (EAGLE-1/2: feature = final-normed hidden, target lm_head) or "eagle3" (fused multi-layer
    features, own lm_head over a draft vocabulary)."""
    hidden_size: int
    """H of the head's layers; equals the target's hidden size (the embedding table is shared)."""
    intermediate_size: int
    """SwiGLU inner size of every head layer."""
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    """The TARGET vocabulary size (embedding rows; EAGLE-1 logits width; ``t2d`` length)."""
    num_hidden_layers: int = 1
    """Decoder layers: 1 (EAGLE) or more (Meta's dense multi-layer draft; later layers are standard)."""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    """HF ``rope_scaling`` dict (``rope_type`` linear / llama3 with its factors) or None for plain RoPE."""
    max_position_embeddings: int = 2048
    """Recorded for engines (set it >= the longest context served); our rotary tables extend past it."""
    target_hidden_size: int | None = None
    """Width of ONE target feature (None = hidden_size). EAGLE-3's ``fc`` takes len(feature_layer_ids) of them."""
    draft_vocab_size: int | None = None
    """EAGLE-3 draft vocabulary size (None = vocab_size); must be None for EAGLE-1."""
    bias: bool = False
    """EAGLE-1 only: ``fc`` has a bias (the reference heads do)."""
    feature_layer_ids: tuple[int, ...] = ()
    """EAGLE-3: target HF hidden_states indices fused by ``fc``, in [low | mid | high] order. () for EAGLE-1."""
    feature_layer_convention: str = OUR_CONVENTION
    """How ``feature_layer_ids`` count: always "hf_hidden_states_index" here (see the module docstring)."""

    def __post_init__(self) -> None:
        if self.kind not in ("eagle1", "eagle3"):
            raise ValueError(f"kind must be 'eagle1' or 'eagle3', got {self.kind!r}")
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "vocab_size", "num_hidden_layers", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.feature_layer_convention != OUR_CONVENTION:
            raise ValueError(f"feature_layer_ids are stored as {OUR_CONVENTION!r}; convert them with "
                             f"feature_ids_to_hf (got convention {self.feature_layer_convention!r})")
        object.__setattr__(self, "feature_layer_ids", tuple(int(i) for i in self.feature_layer_ids))
        if self.target_hidden_size is None:
            object.__setattr__(self, "target_hidden_size", self.hidden_size)
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
        ids = self.feature_layer_ids
        if self.kind == "eagle1":
            if ids:
                raise ValueError("EAGLE-1 heads read the final hidden state: feature_layer_ids must be ()")
            if self.draft_vocab_size not in (None, self.vocab_size):
                raise ValueError("EAGLE-1 heads use the target lm_head: draft_vocab_size must be None")
            if self.target_hidden_size != self.hidden_size:
                raise ValueError("EAGLE-1 heads need target_hidden_size == hidden_size")
            object.__setattr__(self, "draft_vocab_size", None)
        else:
            if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
                raise ValueError(f"EAGLE-3 feature_layer_ids must be distinct non-negative ids, got {ids}")
            if self.bias:
                raise ValueError("EAGLE-3 fc has no bias")
            if self.draft_vocab_size is None:
                object.__setattr__(self, "draft_vocab_size", self.vocab_size)
            if not 0 < self.draft_vocab_size <= self.vocab_size:
                raise ValueError(f"draft_vocab_size must be in [1, {self.vocab_size}], got {self.draft_vocab_size}")
        self.layer_args  # validates the RoPE settings

    @property
    def layer_args(self) -> ModelArgs:
        """``ModelArgs`` of the head's decoder layers (RoPE parsed and validated by model.py)."""
        return ModelArgs.from_hf_config({
            "model_type": "llama", "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
        })

    @property
    def feature_size(self) -> int:
        """F: width of ``target_feature(out)`` (EAGLE-1: H; EAGLE-3: len(ids) * target_hidden_size)."""
        return self.target_hidden_size * max(1, len(self.feature_layer_ids))

    @property
    def out_vocab_size(self) -> int:
        """Width of ``DraftHead.logits``: V (EAGLE-1) or draft_V (EAGLE-3)."""
        return self.vocab_size if self.kind == "eagle1" else self.draft_vocab_size

    @classmethod
    def for_target(
        cls,
        target: ModelArgs,
        kind: HeadKind,
        num_layers: int = 1,
        draft_vocab_size: int | None = None,
        feature_layer_ids: Sequence[int] | None = None,
        intermediate_size: int | None = None,
        bias: bool | None = None,
        max_position_embeddings: int | None = None,
    ) -> HeadConfig:
        """A head config that fits ``target``: its sizes, RoPE and (EAGLE-3) default feature layers.

        ``bias`` defaults to True for EAGLE-1 (as the reference heads) and must stay False for EAGLE-3.
        """
        if kind == "eagle3":
            ids = tuple(feature_layer_ids) if feature_layer_ids is not None else \
                default_feature_layer_ids(target.num_hidden_layers)
            bad = [i for i in ids if not 0 <= i <= target.num_hidden_layers]
            if bad:
                raise ValueError(f"feature_layer_ids {bad} outside [0, {target.num_hidden_layers}] "
                                 f"for a {target.num_hidden_layers}-layer target")
        else:
            ids = tuple(feature_layer_ids or ())
        return cls(
            kind=kind,
            hidden_size=target.hidden_size,
            intermediate_size=intermediate_size or target.intermediate_size,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads,
            head_dim=target.head_dim,
            vocab_size=target.vocab_size,
            num_hidden_layers=num_layers,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            rope_scaling=_rope_scaling(target),
            max_position_embeddings=max_position_embeddings or target.max_position_embeddings,
            target_hidden_size=target.hidden_size,
            draft_vocab_size=draft_vocab_size if kind == "eagle3" else None,
            bias=(kind == "eagle1") if bias is None else bias,
            feature_layer_ids=ids,
        )

    def to_engine_config(self, dtype: torch.dtype | None = None) -> dict[str, Any]:
        """config.json contents in the engines' format, plus our metadata under ``"eaglespec"``."""
        eagle3 = self.kind == "eagle3"
        d: dict[str, Any] = {
            "architectures": [EAGLE3_ARCHITECTURES[0] if eagle3 else EAGLE1_ARCHITECTURES[0]],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": self.num_hidden_layers,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
        }
        if eagle3:
            d |= {"draft_vocab_size": self.draft_vocab_size, "target_hidden_size": self.target_hidden_size,
                  # vLLM's key; its "input of layer k" numbering equals ours
                  "eagle_aux_hidden_state_layer_ids": list(self.feature_layer_ids)}
        else:
            d["bias"] = self.bias  # read by the EAGLE reference
        if dtype is not None:
            d["torch_dtype"] = str(dtype).removeprefix("torch.")
        d["eaglespec"] = {"format_version": FORMAT_VERSION, "kind": self.kind,
                          "feature_layer_ids": list(self.feature_layer_ids),
                          "feature_layer_convention": self.feature_layer_convention}
        return d


def draft_vocab_maps(target_ids: Tensor, vocab_size: int) -> tuple[Tensor, Tensor]:
    """``(d2t, t2d)`` for a draft vocabulary whose draft id j is target id ``target_ids[j]``.

    d2t: int64 [draft_V] offsets (target = draft + d2t[draft]); t2d: bool [V] membership.
    """
    ids = target_ids.to(torch.int64).reshape(-1)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"draft vocabulary ids must lie in [0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise ValueError("draft vocabulary ids must be distinct")
    t2d = torch.zeros(vocab_size, dtype=torch.bool, device=ids.device)
    t2d[ids] = True
    return ids - torch.arange(ids.numel(), device=ids.device), t2d


# ================================================================================================ layers
class HeadAttention(nn.Module):
    """The q/k/v/o projections of a draft layer's grouped-query attention, named as on disk; input may be 2H wide."""

    def __init__(self, args: ModelArgs, in_dim: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.q_proj = nn.Linear(in_dim, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, args.hidden_size, bias=False)



def project(layer: nn.Module, x: Tensor, prefill: bool = False) -> Tensor:
    """A head's linear layer: ``nn.Linear``, or ``runtime.quant.PackedLinear`` once packed next to a packed
    target, which picks its kernel by row count when ``prefill`` (many rows at once: the draft cache's
    catch-up and prompt encoding)."""
    # forward, not __call__: nothing hooks these layers, and nn.Module's call costs ~2 us (a dozen a draft step)
    return layer.forward(x, prefill) if isinstance(layer, PackedLinear) else layer(x)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor, prefill: bool = False) -> Tensor:
        return project(self.down_proj, silu_mul(project(self.gate_proj, x, prefill), project(self.up_proj, x, prefill)),
                       prefill)


class HeadLayer(nn.Module):
    """One draft decoder layer's weights (``runtime.model.LayerWeights``, run by ``decoder_layer``), named as
    on disk (``self_attn.q_proj``, ``mlp.gate_proj``, ...). Three variants, chosen by ``role``:

    * "eagle1_first": no input norm (the fc output enters attention as is);
    * "eagle3_first": attention input cat(input_layernorm(embedding), hidden_norm(h)) (2H), residual = raw h;
    * "standard": a Llama layer (later layers of multi-layer heads).
    """

    def __init__(self, args: ModelArgs, role: Literal["eagle1_first", "eagle3_first", "standard"]) -> None:
        super().__init__()
        h = args.hidden_size
        self.input_layernorm = None if role == "eagle1_first" else RMSNorm(h, args.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, args.rms_norm_eps) if role == "eagle3_first" else None
        self.self_attn = HeadAttention(args, 2 * h if role == "eagle3_first" else h)
        self.post_attention_layernorm = RMSNorm(h, args.rms_norm_eps)
        self.mlp = SwiGLU(h, args.intermediate_size)
        self.n_heads = args.num_attention_heads

    def attn_input(self, x: Tensor, emb: Tensor) -> Tensor:
        """What the attention projections read: cat(input_layernorm(emb), hidden_norm(x)) [B, T, 2H] for the
        first EAGLE-3 layer (embedding first), x itself for the first EAGLE-1 layer (no input norm),
        input_layernorm(x) for standard layers."""
        if self.hidden_norm is not None:
            return torch.cat((self.input_layernorm(emb), self.hidden_norm(x)), dim=-1)
        if self.input_layernorm is not None:
            return self.input_layernorm(x)
        return x

    def project_qkv(self, a: Tensor, prefill: bool = False) -> tuple[Tensor, Tensor]:
        att, (batch, n_new, _) = self.self_attn, a.shape
        q = project(att.q_proj, a, prefill).view(batch, n_new, att.n_heads, att.head_dim)
        k = project(att.k_proj, a, prefill).view(batch, n_new, att.n_kv_heads, att.head_dim)
        return torch.cat((q, k), dim=2), project(att.v_proj, a, prefill).view(batch, n_new, att.n_kv_heads,
                                                                               att.head_dim)

    def project_out(self, o: Tensor, prefill: bool = False) -> Tensor:
        return project(self.self_attn.o_proj, o, prefill)

    def feed_forward(self, x: Tensor, prefill: bool = False) -> Tensor:
        return self.mlp(self.post_attention_layernorm(x), prefill)


# ================================================================================================ the head
class DraftHead(nn.Module):
    """An EAGLE-1/2 or EAGLE-3 draft head (see the module docstring).

    Args:
        config: the head's shape.
        embed_weight: the target's embedding table [V, H] (shared, frozen, not saved).
        target_lm_head_weight: the target's lm_head [V, H] (EAGLE-1 only; shared, frozen, not saved).
        dtype, device: of the head's weights (default: those of ``embed_weight``).
    """

    def __init__(self, config: HeadConfig, embed_weight: Tensor, target_lm_head_weight: Tensor | None = None,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        c = self.config = config
        args = self.layer_args = c.layer_args  # kept: every draft forward reads it (~20 us to build)
        if tuple(embed_weight.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(f"embedding table {tuple(embed_weight.shape)} does not fit the head "
                             f"(vocab_size {c.vocab_size}, hidden_size {c.hidden_size})")
        dtype = dtype or embed_weight.dtype
        device = device if device is not None else embed_weight.device
        eagle3 = c.kind == "eagle3"

        self.fc = nn.Linear(c.feature_size if eagle3 else 2 * c.hidden_size, c.hidden_size, bias=c.bias)
        if eagle3:
            self.midlayer = HeadLayer(args, "eagle3_first")
            # extra layers keep their global index (layers.1, layers.2, ...), as vLLM numbers them
            self.layers = nn.ModuleDict({str(i): HeadLayer(args, "standard") for i in range(1, c.num_hidden_layers)})
            self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
            d2t, t2d = draft_vocab_maps(torch.arange(c.draft_vocab_size), c.vocab_size)
            self.register_buffer("d2t", d2t)  # int64 [draft_V]
            self.register_buffer("t2d", t2d)  # bool [V]
        else:
            self.layers = nn.ModuleList(HeadLayer(args, "eagle1_first" if i == 0 else "standard")
                                        for i in range(c.num_hidden_layers))
        self.rotary = Rotary(args)
        self.layer_steps: list[tuple] | None = None  # see layer_step_args
        self.to(device=device, dtype=dtype)

        # shared with the target: non-persistent buffers follow .to() but are not parameters nor saved
        self.register_buffer("embed_weight", embed_weight.detach().to(device=device, dtype=dtype), persistent=False)
        lm_head = None
        if not eagle3:
            if target_lm_head_weight is None:
                raise ValueError("an EAGLE-1 head needs the target's lm_head weight")
            if tuple(target_lm_head_weight.shape) != (c.vocab_size, c.hidden_size):
                raise ValueError(f"target lm_head {tuple(target_lm_head_weight.shape)} does not fit the head")
            lm_head = target_lm_head_weight.detach().to(device=device, dtype=dtype)
        self.register_buffer("target_lm_head", lm_head, persistent=False)

    @classmethod
    def for_target(cls, target: Transformer, kind: HeadKind, **config_kwargs: Any) -> DraftHead:
        """A freshly initialized head fitting ``target`` (kwargs go to ``HeadConfig.for_target``)."""
        config = HeadConfig.for_target(target.args, kind, **config_kwargs)
        return cls(config, target.embed_tokens.weight, target.lm_head_weight if kind == "eagle1" else None)

    def _apply(self, fn: Any, recurse: bool = True) -> DraftHead:
        self.layer_steps = None  # they hold the old tensors
        super()._apply(fn, recurse)
        # Module.to(dtype) casts every float buffer; the rotary tables must stay float32
        rotary = self._modules.get("rotary")
        if rotary is not None and rotary.cos.dtype != torch.float32:
            self.rotary = Rotary(self.config.layer_args, device=rotary.cos.device)
        return self

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the head computes in: its embedding buffer's, which is created in it and follows every
        ``.to(dtype)`` (``pack_linears`` leaves it alone). Read several times a decode step, so no walk over
        the parameters (that cost ~50 us a call)."""
        return self.embed_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    def decoder_layers(self) -> list[HeadLayer]:
        """The decoder layers in order (layer i uses cache layer i)."""
        if self.config.kind == "eagle3":
            return [self.midlayer, *self.layers.values()]
        return list(self.layers)

    # --------------------------------------------------------------------------------- drafting API
    @property
    def hidden_indices(self) -> tuple[int, ...]:
        """What the target forward must return in ``aux`` (EAGLE-1: nothing, it uses ``out.hidden``)."""
        return self.config.feature_layer_ids

    def target_feature(self, out: ForwardOutput) -> Tensor:
        """[B, T, F] the head's input feature from a target forward run with ``hidden_indices``."""
        if self.config.kind == "eagle1":
            return out.hidden
        if out.aux is None or out.aux.shape[-1] != self.config.feature_size:
            raise ValueError(f"the target forward must be run with hidden_indices={self.hidden_indices} "
                             f"(aux of width {self.config.feature_size})")
        return out.aux

    def fuse(self, target_features: Tensor, prefill: bool = False) -> Tensor:
        """[B, T, F] target features -> [B, T, H] head input h (EAGLE-3: ``fc``; EAGLE-1: identity)."""
        if self.config.kind == "eagle1":
            return target_features.to(self.dtype)
        return project(self.fc, target_features.to(self.dtype), prefill)

    def new_cache(self, max_batch: int, max_len: int) -> KVCache:
        """An empty KV cache for the head's own layers, in its dtype and on its device."""
        c = self.config
        return KVCache(c.num_hidden_layers, max_batch, c.num_key_value_heads, max_len, c.head_dim,
                       dtype=self.dtype, device=self.device)

    def forward(self, h: Tensor, tokens: Tensor, positions: Tensor, cache: KVCache, rows: Tensor | None = None,
                block_mask: Tensor | None = None, host: HostRows | None = None, prefill: bool = False) -> Tensor:
        """One draft step over T new tokens per batch entry; returns the pre-norm output feature [B, T, H].

        Args:
            h: [B, T, H] input feature (``fuse`` of the target's, or the head's own previous output).
            tokens: int64 [B, T], the token one step ahead of each feature; positions: int64 [B, T].
            cache: the head's cache, same contract as ``Transformer.forward``: new K/V are written after
                ``lengths[rows[b]]``, lengths are not moved, the committed prefix is always visible.
            rows: int64 [B] cache rows (None = arange(B)).
            block_mask: bool [B, T, W], W >= T, over the W block slots after the prefix (None = causal);
                the T new tokens are the last T of them (slots ``lengths + W - T + t``), the first W - T hold
                earlier drafted, uncommitted tokens. Passed to ``plan_attention`` as is (W > T needs its
                support for wide blocks).
            host: the rows' committed lengths as held on the host (``plan_attention``; no device read).
            prefill: many rows at once (the draft cache's catch-up): packed layers pick their kernel by rows.

        Under autograd each layer writes into a fresh copy of ``cache.k``/``cache.v`` (the old tensors stay
        intact for backward), so a graph may span several calls on one cache; start every training step
        from a fresh cache (or detach ``cache.k``/``cache.v``) so backward never reaches a freed graph.
        """
        batch, n_new = tokens.shape
        plan = plan_attention(cache, n_new, rows, block_mask, positions=positions, batch=batch, host=host)
        rope = self.rotary(positions, self.dtype, plan.max_position)
        emb = F.embedding(tokens, self.embed_weight)  # [B, T, H]
        x = h.to(self.dtype)
        if self.config.kind == "eagle1":
            x = project(self.fc, torch.cat((emb, x), dim=-1), prefill)  # embedding first
        track_grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))

        def attend(q: Tensor, k: Tensor, v: Tensor, i: int) -> Tensor:
            if track_grad:
                cache.k, cache.v = cache.k.clone(), cache.v.clone()
            return cached_attention(q, k, v, cache, i, plan=plan)

        steps = self.layer_steps
        if steps is not None and not (prefill or track_grad) and x.is_cpu and not torch.compiler.is_compiling():
            c = self.layer_args
            call = LayerStepCall(plan, n_new, rope, c.num_attention_heads, c.num_key_value_heads, c.rms_norm_eps)
            for i, (layer, weights) in enumerate(zip(self.decoder_layers(), steps)):
                own_input = layer.hidden_norm is not None or layer.input_layernorm is None
                x = call(weights, x, cache, i, layer.attn_input(x, emb) if own_input else None)
            return x
        for i, layer in enumerate(self.decoder_layers()):
            x = decoder_layer(layer, i, x, rope, attend, emb=emb, prefill=prefill)
        return x

    def layer_step_args(self) -> list[tuple] | None:
        """Per decoder layer, the weights ``eaglespec::layer_step`` takes (``model.layer_step_table``; q/k/v and
        gate/up stacked), or None unless every layer's projections are packed for our w4a8 kernel, float32 on the
        CPU with the kernels loaded. Installed as ``layer_steps`` next to a packed target
        (``speculative.load_draft_head``): draft steps and commits then run each layer in one call, attending
        with the row-independent kernel instead of torch's (proposals only: what is accepted is the target's)."""
        def args(layer: HeadLayer) -> tuple:
            att, mlp, post = layer.self_attn, layer.mlp, layer.post_attention_layernorm.weight
            pre = layer.input_layernorm.weight if layer.input_layernorm is not None else post  # unused if own input
            return (pre, post, (att.q_proj, att.k_proj, att.v_proj), None, att.o_proj, None,
                    (mlp.gate_proj, mlp.up_proj), None, mlp.down_proj, None)

        return layer_step_table(self.dtype, self.device, (args(layer) for layer in self.decoder_layers()))

    def logits(self, out: Tensor) -> Tensor:
        """float32 [B, T, V_out]: EAGLE-1 target lm_head(out) (V); EAGLE-3 lm_head(norm(out)) (draft_V).

        (A float64 head, as in gradient checks, keeps float64.)
        """
        if self.config.kind == "eagle1":
            logits = F.linear(out, self.target_lm_head)
        else:
            logits = project(self.lm_head, self.norm(out))
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def to_target_ids(self, ids: Tensor) -> Tensor:
        """Draft-vocabulary ids -> target ids (EAGLE-3: ``ids + d2t[ids]``; EAGLE-1: identity)."""
        if self.config.kind == "eagle1":
            return ids
        return ids + self.d2t[ids]

    def set_draft_vocab(self, target_ids: Tensor) -> None:
        """EAGLE-3: draft id j becomes target id ``target_ids[j]`` (e.g. the most frequent tokens)."""
        if self.config.kind != "eagle3":
            raise ValueError("only EAGLE-3 heads have a draft vocabulary")
        if target_ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"need {self.config.draft_vocab_size} draft vocabulary ids, got {target_ids.numel()}")
        d2t, t2d = draft_vocab_maps(target_ids, self.config.vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)


# ================================================================================================ saving
def save_head(head: DraftHead, directory: str | Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in the engine layout (module docstring); returns the dir."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in head.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    config = head.config.to_engine_config(dtype=head.dtype)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return directory


# ================================================================================================ loading
@dataclass
class _Layout:
    kind: HeadKind
    first_layer: str  # on-disk prefix of layer 0 ("midlayer." or "layers.0.")
    layer_config: dict[str, Any]  # the LlamaConfig-like dict of the decoder layers
    top: dict[str, Any] = field(default_factory=dict)  # EAGLE-3 keys (draft_vocab_size, ...)


def _detect_layout(cfg: Mapping[str, Any], names: set[str], where: str) -> _Layout:
    """Head kind and layer-0 naming from config architectures AND tensor names; they must agree."""
    archs = list(cfg.get("architectures") or [])
    spec_type = cfg.get("speculators_model_type")
    has_mid = any(n.startswith("midlayer.") for n in names)
    has_layer0 = any(n.startswith("layers.0.") for n in names)
    eagle3_only = ("d2t", "t2d", "norm.weight", "lm_head.weight", "hidden_norm.weight")
    eagle3_tensors = has_mid or bool(names & set(eagle3_only)) or "layers.0.hidden_norm.weight" in names

    if spec_type is not None:
        if spec_type != "eagle3":
            raise HeadLoadError(f"{where}: speculators_model_type {spec_type!r} is not supported (only 'eagle3')")
        if not isinstance(cfg.get("transformer_layer_config"), Mapping):
            raise HeadLoadError(f"{where}: speculators config lacks transformer_layer_config")
        if has_mid:
            raise HeadLoadError(f"{where}: renamed layout: tensors midlayer.* found where the speculators layout "
                                f"(speculators_model_type: eagle3) expects layers.0.*")
        top = {k: cfg[k] for k in ("draft_vocab_size", "target_hidden_size", "norm_before_residual",
                                   "eagle_aux_hidden_state_layer_ids") if k in cfg}
        return _Layout("eagle3", "layers.0.", dict(cfg["transformer_layer_config"]), top)

    if any(a in EAGLE3_ARCHITECTURES for a in archs):
        if not has_mid and has_layer0:
            raise HeadLoadError(f"{where}: renamed layout: tensors layers.0.* found where {archs} expects "
                                f"midlayer.* (a speculators-layout head needs speculators_model_type: eagle3)")
        return _Layout("eagle3", "midlayer.", dict(cfg), dict(cfg))
    if any(a in EAGLE1_ARCHITECTURES for a in archs):
        if has_mid and not has_layer0 and not any(n in names or f"midlayer.{n}" in names for n in eagle3_only):
            raise HeadLoadError(f"{where}: renamed layout: tensors midlayer.* found where an EAGLE-1 head has layers.0.*")
        if eagle3_tensors:
            found = sorted(n for n in names if n.startswith("midlayer.") or n in ("d2t", "t2d", "lm_head.weight",
                                                                                  "norm.weight"))[:4]
            raise HeadLoadError(f"{where}: config architectures {archs} describe an EAGLE-1 head but the file "
                                f"holds EAGLE-3 tensors ({', '.join(found)} ...)")
        return _Layout("eagle1", "layers.0.", dict(cfg))
    raise HeadLoadError(f"{where}: config architectures {archs} name no known draft head "
                        f"(EAGLE-1: {list(EAGLE1_ARCHITECTURES)}; EAGLE-3: {list(EAGLE3_ARCHITECTURES)} "
                        f"or a speculators config)")


def _config_from_layout(layout: _Layout, cfg: Mapping[str, Any], n_target_layers: int, where: str) -> HeadConfig:
    """Build the HeadConfig, refusing every config flag that would change the math we implement.

    EAGLE-3 feature layers: ``eaglespec.feature_layer_ids`` (with its convention), else vLLM's
    ``eagle_aux_hidden_state_layer_ids`` (top level or under ``eagle_config``; "input of layer k"),
    else the EAGLE-3 default for an ``n_target_layers``-layer target.
    """
    lc, top = layout.layer_config, layout.top
    model_type = lc.get("model_type", "llama")
    if model_type != "llama":
        raise HeadLoadError(f"{where}: draft layers of model_type {model_type!r} are not supported (only llama)")
    for flag in ("attention_bias", "mlp_bias"):
        if lc.get(flag):
            raise HeadLoadError(f"{where}: config flag {flag}: true is not supported by draft heads")
    if top.get("norm_before_residual"):
        raise HeadLoadError(f"{where}: config flag norm_before_residual: true is not supported "
                            f"(the first layer's residual must be the raw fused feature)")
    if layout.kind == "eagle3" and lc.get("tie_word_embeddings"):
        raise HeadLoadError(f"{where}: config flag tie_word_embeddings: true is not supported for EAGLE-3 heads")
    try:
        args = ModelArgs.from_hf_config({**lc, "model_type": "llama"})
    except UnsupportedModelError as e:
        raise HeadLoadError(f"{where}: unsupported config: {e}") from None
    except KeyError as e:
        raise HeadLoadError(f"{where}: config lacks key {e}") from None

    meta = cfg.get("eaglespec") or {}
    if meta.get("kind") not in (None, layout.kind):
        raise HeadLoadError(f"{where}: eaglespec.kind {meta['kind']!r} contradicts the {layout.kind} layout")
    ids: tuple[int, ...] = ()
    eagle_config = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), Mapping) else {}
    try:
        if layout.kind == "eagle1":
            if meta.get("feature_layer_ids"):
                raise ValueError("eaglespec.feature_layer_ids given for an EAGLE-1 head")
        elif "feature_layer_ids" in meta:
            ids = feature_ids_to_hf(meta["feature_layer_ids"], meta.get("feature_layer_convention", OUR_CONVENTION))
        elif top.get("eagle_aux_hidden_state_layer_ids") is not None:
            ids = feature_ids_to_hf(top["eagle_aux_hidden_state_layer_ids"], "input_of_layer")
        elif eagle_config.get("eagle_aux_hidden_state_layer_ids") is not None:
            ids = feature_ids_to_hf(eagle_config["eagle_aux_hidden_state_layer_ids"], "input_of_layer")
        else:
            ids = default_feature_layer_ids(n_target_layers)
        return HeadConfig(
            kind=layout.kind, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
            num_attention_heads=args.num_attention_heads, num_key_value_heads=args.num_key_value_heads,
            head_dim=args.head_dim, vocab_size=args.vocab_size, num_hidden_layers=args.num_hidden_layers,
            rms_norm_eps=args.rms_norm_eps, rope_theta=args.rope_theta, rope_scaling=_rope_scaling(args),
            max_position_embeddings=args.max_position_embeddings,
            target_hidden_size=top.get("target_hidden_size"),
            draft_vocab_size=top.get("draft_vocab_size") if layout.kind == "eagle3" else None,
            bias=bool(lc.get("bias", False)) if layout.kind == "eagle1" else False,
            feature_layer_ids=ids,
        )
    except ValueError as e:
        raise HeadLoadError(f"{where}: invalid head config: {e}") from None


def _check_fits(config: HeadConfig, target: ModelArgs, where: str) -> None:
    problems = []
    if config.vocab_size != target.vocab_size:
        problems.append(f"vocab_size {config.vocab_size} != the target's {target.vocab_size}")
    if config.hidden_size != target.hidden_size:
        problems.append(f"hidden_size {config.hidden_size} != the target's {target.hidden_size} (shared embedding)")
    if config.target_hidden_size != target.hidden_size:
        problems.append(f"target_hidden_size {config.target_hidden_size} != the target's hidden size {target.hidden_size}")
    for name, limit in (("intermediate_size", 16 * target.intermediate_size),
                        ("num_hidden_layers", target.num_hidden_layers),
                        ("num_attention_heads", 16 * target.num_attention_heads)):
        if getattr(config, name) > limit:  # absurd sizes would allocate before anything else fails
            problems.append(f"{name} {getattr(config, name)} is absurd for this target (at most {limit})")
    bad = [i for i in config.feature_layer_ids if i > target.num_hidden_layers]
    if bad:
        problems.append(f"feature_layer_ids {list(config.feature_layer_ids)} reach beyond the target's "
                        f"{target.num_hidden_layers} layers (max index {target.num_hidden_layers})")
    if problems:
        raise HeadLoadError(f"{where}: head does not fit the target: " + "; ".join(problems))


def _check_vocab_maps(d2t: Tensor, t2d: Tensor, vocab_size: int, where: str) -> tuple[Tensor, Tensor]:
    """d2t/t2d must be integer/bool and describe the same set of distinct in-range target ids."""
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise HeadLoadError(f"{where}: d2t must be an integer tensor, got {d2t.dtype}")
    if t2d.dtype.is_floating_point:
        raise HeadLoadError(f"{where}: t2d must be a bool tensor, got {t2d.dtype}")
    if t2d.dtype != torch.bool and not ((t2d == 0) | (t2d == 1)).all():
        raise HeadLoadError(f"{where}: t2d must hold only 0/1")
    d2t, t2d = d2t.to(torch.int64), t2d.to(torch.bool)
    target_ids = torch.arange(d2t.numel()) + d2t
    if int(target_ids.min()) < 0 or int(target_ids.max()) >= vocab_size:
        raise HeadLoadError(f"{where}: d2t maps draft ids outside the target vocabulary [0, {vocab_size})")
    if target_ids.unique().numel() != target_ids.numel():
        raise HeadLoadError(f"{where}: d2t maps several draft ids to the same target id")
    _, expected_t2d = draft_vocab_maps(target_ids, vocab_size)
    if not torch.equal(expected_t2d, t2d):
        raise HeadLoadError(f"{where}: t2d is inconsistent with d2t ({int(t2d.sum())} target ids marked, "
                            f"{int((expected_t2d != t2d).sum())} differ from the ids d2t maps to)")
    return d2t, t2d


def _hint(name: str, config: HeadConfig, kind: str) -> str:
    """Why a tensor is missing/unexpected, when a common mistake explains it."""
    if name == "fc.bias":
        return f" (config bias: {str(config.bias).lower()})"
    if kind == "missing" and name.startswith("layers.") and config.kind == "eagle3":
        return " (extra EAGLE-3 layers are layers.1 ... layers.N-1)"
    if kind == "unexpected" and name == "layers.0.input_layernorm.weight" and config.kind == "eagle1":
        return " (the first EAGLE-1 layer has no input_layernorm)"
    return ""


def load_head(directory: str | Path, target: Transformer, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> DraftHead:
    """Load a head saved by ``save_head`` or by SpecForge / the EAGLE reference / speculators, strictly.

    The head type comes from the files (config architectures + tensor names), never from a flag. Refused
    with ``HeadLoadError``: missing / unexpected / mis-shaped tensors, a renamed layer-0 layout, a config flag
    that changes the math (unsupported rope type, attention/mlp bias, norm_before_residual, ...), a head that
    does not fit ``target`` (sizes, vocabulary, feature layers) and inconsistent d2t/t2d. An
    ``embed_tokens.weight`` stored with the head is accepted only when it equals the target's embedding.
    dtype/device default to the target's.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not config_path.is_file():
        raise HeadLoadError(f"{directory}: no {CONFIG_FILE}")
    if not weights_path.is_file():
        others = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt*"))
        raise HeadLoadError(f"{directory}: no {WEIGHTS_FILE}" + (f" (found {others}; only safetensors is read)"
                                                                 if others else ""))
    try:
        cfg = json.loads(config_path.read_text())
        tensors = load_file(str(weights_path), device="cpu")
    except (json.JSONDecodeError, SafetensorError, OSError) as e:
        raise HeadLoadError(f"{directory}: unreadable head files: {e}") from None
    where = str(directory)

    layout = _detect_layout(cfg, set(tensors), where)
    config = _config_from_layout(layout, cfg, target.args.num_hidden_layers, where)
    _check_fits(config, target.args, where)

    # the shared embedding may be stored with the head; it must be the target's own
    stored_embed = tensors.pop("embed_tokens.weight", None)
    if stored_embed is not None and not (stored_embed.shape == target.embed_tokens.weight.shape and torch.equal(
            stored_embed.to(target.embed_tokens.weight), target.embed_tokens.weight)):
        raise HeadLoadError(f"{where}: tensor embed_tokens.weight differs from the target's embedding table "
                            f"(the head was trained for another target)")
    for name in [n for n in tensors if n.endswith("rotary_emb.inv_freq")]:
        del tensors[name]  # derived buffer some exporters keep
    if layout.first_layer != "midlayer." and config.kind == "eagle3":  # speculators: layers.0.* -> midlayer.*
        tensors = {("midlayer." + n[len("layers.0."):] if n.startswith("layers.0.") else n): t
                   for n, t in tensors.items()}

    head = DraftHead(config, target.embed_tokens.weight,
                     target.lm_head_weight if config.kind == "eagle1" else None, dtype=dtype or target.dtype,
                     device=device if device is not None else target.device)
    expected = {n: tuple(t.shape) for n, t in head.state_dict().items()}

    def disk(name: str) -> str:
        return layout.first_layer + name[len("midlayer."):] if name.startswith("midlayer.") else name

    missing = [disk(n) + _hint(n, config, "missing") for n in expected if n not in tensors]
    unexpected = [disk(n) + _hint(n, config, "unexpected") for n in tensors if n not in expected]
    misshaped = [f"{disk(n)}: got {tuple(tensors[n].shape)}, expected {s}" for n, s in expected.items()
                 if n in tensors and tuple(tensors[n].shape) != s]
    if missing or unexpected or misshaped:
        parts = [f"{label} tensors: {', '.join(items[:20])}{' ...' if len(items) > 20 else ''}" for label, items in
                 (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)) if items]
        raise HeadLoadError(f"{where}: {config.kind} head ({layout.first_layer}* layout): " + "; ".join(parts))
    if config.kind == "eagle3":
        tensors["d2t"], tensors["t2d"] = _check_vocab_maps(tensors["d2t"], tensors["t2d"], config.vocab_size, where)
    for name, t in tensors.items():
        if name in ("d2t", "t2d"):
            continue
        if not t.dtype.is_floating_point:
            raise HeadLoadError(f"{where}: tensor {disk(name)} has non-float dtype {t.dtype}")
        if not torch.isfinite(t).all():
            raise HeadLoadError(f"{where}: tensor {disk(name)} holds non-finite values")
    head.load_state_dict(tensors, strict=True)
    return head

