"""Replace a loaded target's linear layers by packed int8 / int4 ones (``quant.PackedLinear``).

For a GGUF source in int4, the q/k/v, output, gate/up and down projections whose GGUF tensors are Q4_0 / Q4_1
are packed from the file's own blocks (exact: the same 4-bit values, scales and offsets, scales rounded to
bfloat16 for the kernel), fused the way the model fuses them; any other projection is quantized from its
float32 weight. The lm_head is ranked in the same format with its best candidates rescored in float32 (see
pack_model).
Norms and rotary tables stay float32; the KV cache is float32 unless ``runtime.loading.resolve_kv_dtype`` picks
float16 (``load_target``). Attention runs in eaglespec::row_attention where the kernels are built, else in float64
(Transformer.attention_dtype).
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglespec.runtime import cpu_kernels
from eaglespec.runtime.gguf_blocks import QuantTensor, read_quant_tensors, unpermute_rows
from eaglespec.runtime.quant import (FORMATS, KernelPlan, PackedLinear, calibrate_kernels, calibrate_prompt_dtype,
                                     default_plan, resolve_int4_kernel, resolve_prompt_dtype)

__all__ = ["pack_linears", "pack_model"]

_GGUF_PARTS = {"wqkv": ("attn_q", "attn_k", "attn_v"), "wo": ("attn_output",), "w13": ("ffn_gate", "ffn_up"),
               "w2": ("ffn_down",)}


def _always_packed(fmt: str, what: str) -> KernelPlan:
    """A plan that runs every row count in the packed kernel (no dense float32 copy is kept)."""
    return KernelPlan({fmt: [(1 << 30, "packed")]}, measured_on=what)


def _fused_gguf(blocks: dict[str, QuantTensor], layer: int, attr: str, args) -> QuantTensor | None:
    parts = []
    for p in _GGUF_PARTS[attr]:
        t = blocks.get(f"blk.{layer}.{p}.weight")
        if t is None or t.kind != "int4":
            return None
        if p == "attn_q":
            t = t.select_rows(unpermute_rows(t.shape[0], args.num_attention_heads))
        elif p == "attn_k":
            t = t.select_rows(unpermute_rows(t.shape[0], args.num_key_value_heads))
        parts.append(t)
    cat = lambda f: torch.cat([getattr(t, f) for t in parts])
    return QuantTensor(f"blk.{layer}.{attr}", parts[0].ggml_type, "int4", cat("q"), cat("scale"), cat("zero"))


class _MeasuredPlans:
    """The prompt-forward ``KernelPlan`` of each weight shape: ``plan`` if given, else measured on this machine
    (``quant.calibrate_kernels``, cached under ``cache``) when ``cache`` is given, else the default plan."""

    def __init__(self, fmt: str, kernel: str, plan: KernelPlan | None, cache: str | Path | None,
                 dense_dtype: torch.dtype | None = None) -> None:
        self.fmt, self.kernel, self.plan, self.cache, self.dense_dtype = fmt, kernel, plan, cache, dense_dtype
        self.by_shape: dict[tuple[int, int], KernelPlan] = {}

    def __call__(self, shape: tuple[int, int]) -> KernelPlan | None:
        if self.plan is not None or self.cache is None:
            return self.plan
        if shape not in self.by_shape:
            self.by_shape[shape] = calibrate_kernels(shape, (self.fmt,), cache_dir=self.cache, kernel=self.kernel,
                                                     dense_dtype=self.dense_dtype)
        return self.by_shape[shape]


def pack_model(model, fmt: str, gguf_path: str | Path | None = None, plan: KernelPlan | None = None,
               int4_kernel: str = "auto", kernel_cache: str | Path | None = None, prompt_dtype: str = "auto") -> dict:
    """Pack ``model``'s projections in place; returns counts of what came from where. ``int4_kernel``: one of
    ``quant.INT4_KERNELS`` (``auto``: ours where it runs, else torch's). Prompt forwards run each projection
    by ``plan``; without one, by a plan measured on this machine per weight shape when ``kernel_cache`` (a
    directory) is given (packed or dense by row count; a few seconds once, then read back; not for the
    ``w4a8`` kernel, see below), else by ``quant.default_plan``. ``prompt_dtype`` (``quant.PROMPT_DTYPES``):
    the dtype of the dense copy those prompt rows multiply by; ``auto`` measures float32 against bfloat16 on
    this machine when ``kernel_cache`` is given (``quant.calibrate_prompt_dtype``), else keeps float32."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown packed format {fmt!r}; use one of {FORMATS}")
    kernel = resolve_int4_kernel(int4_kernel) if fmt == "int4" else "torch"
    prompt_dtype = resolve_prompt_dtype(prompt_dtype)
    if model.dtype != torch.float32 or model.device.type != "cpu":
        raise ValueError(f"packed {fmt} weights need the float32 CPU model (got {model.dtype} on {model.device})")
    args = model.args
    blocks = read_quant_tensors(gguf_path) if gguf_path is not None and fmt == "int4" else {}
    counts = {"from_gguf_blocks": 0, "quantized": 0}
    if plan is not None:  # an explicit plan carries its dense dtype
        if prompt_dtype != "auto":
            raise ValueError(f"prompt_dtype {prompt_dtype!r} and a plan: give the dtype in the plan (dense_dtype)")
        dense_dtype = plan.dense_dtype
    elif prompt_dtype == "auto":
        shapes = [tuple(getattr(layer, attr).shape) for layer in model.layers for attr in _GGUF_PARTS]
        dense_dtype = calibrate_prompt_dtype(shapes, kernel_cache) if kernel_cache is not None else torch.float32
    else:
        dense_dtype = getattr(torch, prompt_dtype)
    dense_dtype = None if dense_dtype == torch.float32 else dense_dtype  # KernelPlan's "float32"
    # w4a8 would win every prompt size on speed (2.7x float32 at 128-512 rows, 2-core EPYC), but its int8
    # activations over a whole prompt move the first answer token where it is a near-tie: on the default model
    # "What is the capital of France?" was answered "L'Étoile, la Marseillaise, ..." instead of "The capital of
    # France is Paris." (float32 and the float32 prompt agree). So a w4a8 target keeps the default plan: prompts
    # of more than 16 rows run densely, as the reference does; the other kernels are measured. Dense in bfloat16
    # where the machine has bfloat16 dot products: 1.7-2.0x float32 at 94-1000 rows on a 2-core EPYC, and as
    # faithful (perplexity of GSM8K texts as prompts 6.2510 against 6.2504; greedy agreement with the float32
    # model's answers moving both ways with the prompt set; France answered as in float32; docs/RUNTIME.md
    # "Prompts in bfloat16").
    if plan is None and (kernel == "w4a8" or kernel_cache is None):
        plan = default_plan()
        plan.dense_dtype, plan.measured_on = dense_dtype, f"default plan, dense {dense_dtype or 'float32'}"
    plans = _MeasuredPlans(fmt, kernel, plan, kernel_cache if kernel != "w4a8" else None, dense_dtype)
    for i, layer in enumerate(model.layers):
        for attr in _GGUF_PARTS:
            qt = _fused_gguf(blocks, i, attr, args) if blocks else None
            if qt is not None:
                packed = PackedLinear.from_int4(qt.q, qt.scale, qt.zero, 32, plans(tuple(qt.q.shape)), kernel=kernel)
                counts["from_gguf_blocks"] += 1
            else:
                w = getattr(layer, attr).data
                packed = PackedLinear.from_float(w, fmt, plan=plans(tuple(w.shape)), kernel=kernel)
                counts["quantized"] += 1
            del layer._parameters[attr]
            setattr(layer, attr, packed)
    # The lm_head gets a packed copy in the model's format that ranks the vocabulary (int4: 8x less to read than
    # float32, 2x less than int8, which was 14% of an int4 decode step); the float32 weight
    # stays for the embedding and for rescoring the best candidates exactly (Transformer.output_logits): packed
    # kernels return bfloat16, whose ties would otherwise flip greedy argmaxes. Always the packed kernel (no
    # dense float32 copy for prompts: only the last prompt position needs logits).
    # Measured on the default model (2-core AMD EPYC, 30 GSM8K test question+answer texts, 5,522 positions):
    # the rescored argmax equals the float32 lm_head's at every position in int8 and int4; perplexity 6.5075
    # (int8) vs 6.5222 (int4) through the int4 target; the projection at 1 / 4 / 8 rows 4.2 / 4.1 / 8.1 ms in
    # int8 vs 2.1 / 2.0 / 5.1 ms in int4 (docs/RUNTIME.md).
    model.lm_head_packed = PackedLinear.from_float(model.lm_head_weight.data, fmt,
                                                   plan=_always_packed(fmt, "lm_head"), kernel=kernel)
    model.attention_dtype = torch.float64  # see Transformer.attention_dtype
    model.row_attention = cpu_kernels.available()  # decode / verify: float32, row-independent (row_attention.cpp)
    model.layer_steps = model.layer_step_args() if model.row_attention else None  # each layer in one call
    model.precision = fmt
    model.int4_kernel = kernel if fmt == "int4" else None
    model.prompt_dtype = str(dense_dtype or torch.float32).removeprefix("torch.")
    return counts


def pack_linears(module: torch.nn.Module, fmt: str = "int8", kernel: str = "torch",
                 kernel_cache: str | Path | None = None) -> int:
    """Replace every ``nn.Linear`` inside ``module`` (in place) by a packed one quantized from its float weight
    (bias kept); returns how many were replaced; ``kernel``: the int4 kernel (``quant.INT4_KERNELS``). Used for
    draft heads next to a packed target: a draft's weights
    only decide what is proposed, never what is accepted, so its precision costs acceptance at most, not
    correctness (the verification is exact either way). ``kernel_cache``: measure the many-row (``prefill``)
    kernel per weight shape on this machine, packed or dense bfloat16, cached in that directory."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown packed format {fmt!r}; use one of {FORMATS}")
    kernel = resolve_int4_kernel(kernel) if fmt == "int4" else "torch"
    # Steps draft a few rows: packed. The draft cache's catch-up encodes tens to hundreds of rows at once, where
    # the int8 kernel costs 2.7x a bfloat16 GEMM (the head's linears at 256 rows, 2-core EPYC: 17.2 vs 6.3 ms;
    # 1.1 vs 0.7 ms at 16 rows, 0.29 vs 0.39 at 4): without measurements those rows run densely in bfloat16.
    fixed = KernelPlan({fmt: [(8, "packed"), (1 << 30, "dense")]}, measured_on="draft", dense_dtype=torch.bfloat16)
    plans = _MeasuredPlans(fmt, kernel, None if kernel_cache is not None else fixed, kernel_cache, torch.bfloat16)
    return _pack_children(module, fmt, kernel, plans)


def _pack_children(module: torch.nn.Module, fmt: str, kernel: str, plans: _MeasuredPlans) -> int:
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            if child.weight.dtype != torch.float32 or child.weight.device.type != "cpu":
                raise ValueError(f"packing {name}: needs a float32 CPU weight (got {child.weight.dtype} on "
                                 f"{child.weight.device})")
            w = child.weight.detach()
            packed = PackedLinear.from_float(w, fmt, plan=plans(tuple(w.shape)), kernel=kernel)
            if child.bias is not None:
                packed.bias = child.bias.detach().clone()
            setattr(module, name, packed)
            count += 1
        else:
            count += _pack_children(child, fmt, kernel, plans)
    return count
