"""A float16 KV cache (`--kv-dtype`): the attention kernel reads it exactly as it reads the same values in float32,
the one-call layer writes it as torch rounds, speculation stays lossless over it, and the choice is refused
where it cannot run."""

import pytest
import torch

from eaglespec.config import GenerationConfig
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import cpu_kernels, quant, w4a8
from eaglespec.runtime.kvcache import HostRows
from eaglespec.runtime.loading import ModelLoadError, load_target, resolve_kv_dtype
from eaglespec.runtime.model import attention
from eaglespec.runtime.pack import pack_model
from eaglespec.runtime.quant import KernelPlan
from eaglespec.spec.proposer import EagleProposer
from eaglespec.spec.strategies import Chain, DynamicTree
from eaglespec.spec.tree import tree_mask
from helpers import tiny_target, tiny_tokenizer
from test_speculative import PROMPTS, make_head

kernels = pytest.mark.skipif(not cpu_kernels.available(),
                             reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


def _half_case(batch, n_new, prefix, seed, heads=9, kv_heads=3, dim=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_new, heads, dim, generator=g)
    k = (torch.randn(batch, kv_heads, prefix + n_new, dim, generator=g) * 2).half()
    v = torch.randn(batch, kv_heads, prefix + n_new, dim, generator=g).half()
    return q, k, v


@kernels
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 2, 128), (12, 1, 64), (4, 4, 32)])
@pytest.mark.parametrize("prefix,parents", [
    (100, [-1, 0, 1, 2, 3, 4, 5, 6]),       # a chain over several key blocks and value chunks
    (47, [-1, 0, 0, 1, 1, 2, 2, 3, 5, 5]),  # a tree whose shared context ends inside a block
    (5, [-1]),                              # one query, a context shorter than a block
])
def test_float16_keys_and_values_give_exactly_what_their_float32_values_give(heads, kv_heads, dim, prefix, parents):
    """The kernel converts float16 rows to float32 (exact) before the same arithmetic: every output bit equals the
    float32 call's on the converted values, on every shape path (compiled head shapes and run-time sized ones),
    for shared context, per-query tails and a lone decode query alike."""
    n = len(parents)
    q, k, v = _half_case(2, n, prefix, seed=prefix + heads, heads=heads, kv_heads=kv_heads, dim=dim)
    block = tree_mask(torch.tensor([parents]), torch.ones(1, n, dtype=torch.bool))[0]
    mask = torch.cat([torch.ones(n, prefix, dtype=torch.bool), block], dim=1)[None, None]
    got = attention(q, k, v, mask, exact_rows=True)
    assert got.dtype == torch.float32
    assert torch.equal(got, attention(q, k.float(), v.float(), mask, exact_rows=True))


@kernels
def test_random_masks_and_more_queries_than_a_job_over_a_float16_cache_view():
    """Masks that part anywhere, 20 queries (more than one job takes), keys and values as strided views of a
    larger float16 cache: still the float32 call's bits."""
    g = torch.Generator().manual_seed(3)
    q, k, v = _half_case(2, 20, 60, seed=3)
    cache_k = torch.zeros(4, 3, 96, 64, dtype=torch.float16)
    cache_v = torch.zeros_like(cache_k)
    cache_k[1:3, :, :80], cache_v[1:3, :, :80] = k, v
    mask = torch.rand(2, 1, 20, 80, generator=g) > 0.3
    mask[..., 79] = True
    got = attention(q, cache_k[1:3, :, :80], cache_v[1:3, :, :80], mask, exact_rows=True)
    assert torch.equal(got, attention(q, k.float(), v.float(), mask, exact_rows=True))


def _packed_w4a8():
    """A tiny int4 target in the w4a8 kernel for every row count: prompts too, so that a prompt forward does not
    change kernels with the rows of its batch (dense beyond 16 rows by default), which would part batch-1 from
    batch-4 decoding before any cache is read."""
    if not w4a8.available():
        pytest.skip(f"w4a8 kernel unavailable: {w4a8.unavailable_reason()}")
    target, _ = tiny_target("llama")
    pack_model(target.model, "int4", int4_kernel="w4a8",
               plan=KernelPlan({f: [(1 << 30, "packed")] for f in quant.FORMATS}))
    assert target.model.layer_steps is not None  # decode steps run the one-call layer (kernels/layer_step.cpp)
    return target


def test_the_one_call_layer_writes_float16_keys_and_values_as_torch_rounds_them():
    """Layer 0's new key and value depend on the token alone: written by the one-call layer into a float16 cache
    they equal the float32 cache's values rounded by torch (nearest even), bit for bit."""
    target = _packed_w4a8()
    model = target.model
    caches = {}
    for dt in (torch.float32, torch.float16):
        model.kv_dtype = dt
        cache = caches[dt] = model.new_cache(2, 16)
        tokens = torch.tensor([[5, 9, 11], [7, 3, 2]])
        with torch.inference_mode():
            model(tokens, torch.arange(3).expand(2, 3), cache, rows=torch.arange(2), host=HostRows((0, 1), (0, 0), 3))
    assert caches[torch.float16].k.dtype == torch.float16
    for name in ("k", "v"):
        want = getattr(caches[torch.float32], name)[0, :, :, :3].half()
        assert torch.equal(getattr(caches[torch.float16], name)[0, :, :, :3], want), name


@pytest.mark.parametrize("tree", [Chain(4), DynamicTree(topk=3, depth=4, tree_tokens=10)], ids=["chain4", "dynamic"])
def test_greedy_speculative_equals_vanilla_over_a_float16_cache(tree):
    target = _packed_w4a8()
    target.model.kv_dtype = resolve_kv_dtype(target.model, "float16")
    reqs = [Request(tiny_tokenizer().encode(p), GenerationConfig(32, ignore_eos=True)) for p in PROMPTS]
    with torch.inference_mode():
        vanilla = [c.token_ids for c in Engine(target, max_batch_size=1).generate(reqs)]
        engine = Engine(target, EagleProposer(make_head(target, "eagle3"), tree), max_batch_size=4)
        got = engine.generate(reqs)
    assert engine.cache.k.dtype == torch.float16
    assert [c.token_ids for c in got] == vanilla


def test_auto_picks_float16_only_where_the_attention_kernel_reads_it():
    plain, _ = tiny_target("llama")
    assert resolve_kv_dtype(plain.model, "auto") == torch.float32
    assert resolve_kv_dtype(plain.model, "float32") == torch.float32
    with pytest.raises(ValueError, match=r"--kv-dtype float16: only an eager packed .* does not attend"):
        resolve_kv_dtype(plain.model, "float16")
    with pytest.raises(ValueError, match=r"--kv-dtype 'half': expected one of auto, float32, float16"):
        resolve_kv_dtype(plain.model, "half")
    bf16, _ = tiny_target("llama", dtype=torch.bfloat16)
    assert resolve_kv_dtype(bf16.model, "auto") == torch.bfloat16
    with pytest.raises(ValueError, match="computes in bfloat16"):
        resolve_kv_dtype(bf16.model, "float32")
    if cpu_kernels.available():
        packed, _ = tiny_target("llama")
        pack_model(packed.model, "int8")
        assert packed.model.row_attention
        assert resolve_kv_dtype(packed.model, "auto") == torch.float16
        packed.model.step_graph = object()  # compiled: inductor's attention reads the cache in the model's dtype
        assert resolve_kv_dtype(packed.model, "auto") == torch.float32
        with pytest.raises(ValueError, match="it runs compiled"):
            resolve_kv_dtype(packed.model, "float16")


def test_load_target_refuses_an_unknown_kv_dtype_before_loading(tmp_path):
    with pytest.raises(ModelLoadError, match="--kv-dtype 'float8': expected one of auto, float32, float16"):
        load_target(str(tmp_path / "no-such-model"), kv_dtype="float8")
    with pytest.raises(ModelLoadError, match="no-such-model"):  # a known name in any case passes on to the model
        load_target(str(tmp_path / "no-such-model"), kv_dtype=" Float16 ")


def test_the_calibration_keys_a_float16_cache_apart():
    from eaglespec.engine.calibrate import _runtime_label

    target = _packed_w4a8()
    target.model.kv_dtype = torch.float32
    plain = _runtime_label(target.model)
    target.model.kv_dtype = torch.float16
    assert _runtime_label(target.model) == plain + "/kv16"
