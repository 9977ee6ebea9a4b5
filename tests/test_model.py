"""Our Transformer against HF transformers on tiny random models, and against itself across cache usages.

Oracles: HF logits / hidden states (fp32, 1e-4); incremental decoding, chunked prefill, tree blocks,
ragged batches, rollback and compaction all reproduce a plain causal forward of the same tokens.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from eaglespec.runtime.kvcache import ContextOverflowError
from eaglespec.runtime.model import (
    ModelArgs,
    StateDictMismatchError,
    Transformer,
    UnsupportedModelError,
)

VOCAB = 128
BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}

FAMILIES = {
    "llama": ("llama", {}),
    "llama3_rope": ("llama", {"rope_scaling": LLAMA3_ROPE}),
    "llama_linear_rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama_tied": ("llama", {"tie_word_embeddings": True}),
    "llama_biases": ("llama", {"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 4}),
    "mistral": ("mistral", {"sliding_window": 64}),
    "qwen2": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"head_dim": 24, "num_key_value_heads": 1}),
}


def _hf_classes(kind: str):
    import transformers as tf

    return {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
    }[kind]


@functools.lru_cache(maxsize=None)
def hf_model(family: str):
    """A tiny HF model with weights large enough (and norm weights away from 1) to make errors visible."""
    kind, extra = FAMILIES[family]
    config_cls, model_cls = _hf_classes(kind)
    torch.manual_seed(1234)
    model = model_cls(config_cls(**{**BASE, **extra})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model


@functools.lru_cache(maxsize=None)
def our_model(family: str, dtype: torch.dtype = torch.float32) -> Transformer:
    hf = hf_model(family)
    return Transformer.from_state_dict(ModelArgs.from_hf_config(hf.config), hf.state_dict(), dtype=dtype)


def _tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _positions(batch: int, start: int, length: int) -> torch.Tensor:
    return torch.arange(start, start + length).expand(batch, length)


@torch.inference_mode()
def full_logits(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """Plain causal forward of [B, T] tokens from an empty cache: float32 [B, T, V]."""
    b, t = tokens.shape
    cache = model.new_cache(b, t + 4)
    return model(tokens, _positions(b, 0, t), cache, logits_at="all").logits


# ================================================================================================ vs HF
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_hf(family):
    hf, ours = hf_model(family), our_model(family)
    for length in (1, 6, 17):
        tokens = _tokens(2, length, seed=length)
        with torch.inference_mode():
            ref = hf(tokens).logits.float()
        got = full_logits(ours, tokens)
        assert got.dtype == torch.float32 and got.shape == ref.shape
        assert (got - ref).abs().max().item() <= 1e-4, family


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_hidden_indices_match_hf_hidden_states(family):
    hf, ours = hf_model(family), our_model(family)
    n_layers = hf.config.num_hidden_layers
    tokens = _tokens(2, 7)
    with torch.inference_mode():
        ref = hf(tokens, output_hidden_states=True).hidden_states  # L + 1 entries, the last one normed
        out = ours(tokens, _positions(2, 0, 7), ours.new_cache(2, 8), hidden_indices=(2, 0, 1, n_layers))
    h = hf.config.hidden_size
    assert out.aux.shape == (2, 7, 4 * h)
    for k, idx in enumerate((2, 0, 1)):
        assert torch.allclose(out.aux[..., k * h:(k + 1) * h], ref[idx], atol=1e-5), idx
    # index L is the pre-norm residual stream; HF's last entry is after the final norm, like out.hidden
    assert torch.allclose(out.hidden, ref[n_layers], atol=1e-5)
    assert not torch.allclose(out.aux[..., 3 * h:], ref[n_layers], atol=1e-2)
    assert out.logits is None


def test_rejects_out_of_range_hidden_index():
    ours = our_model("llama")
    with pytest.raises(ValueError, match="hidden_indices"):
        ours(_tokens(1, 2), _positions(1, 0, 2), ours.new_cache(1, 4), hidden_indices=(4,))


def test_logits_at_indices():
    ours = our_model("llama")
    tokens = _tokens(2, 6)
    ref = full_logits(ours, tokens)
    idx = torch.tensor([[5, 0, 2], [1, 1, 4]])
    with torch.inference_mode():
        out = ours(tokens, _positions(2, 0, 6), ours.new_cache(2, 8), logits_at=idx)
    assert out.logits.shape == (2, 3, VOCAB) and out.logits.dtype == torch.float32
    assert torch.allclose(out.logits, ref.gather(1, idx[..., None].expand(-1, -1, VOCAB)), atol=1e-5)
    assert out.hidden.shape == (2, 6, 64) and out.aux is None


# ===================================================================================== cache usages
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_prefill_then_decode_equals_full_forward(family):
    ours = our_model(family)
    tokens = _tokens(2, 11, seed=3)
    ref = full_logits(ours, tokens)
    cache = ours.new_cache(2, 16)
    with torch.inference_mode():
        out = ours(tokens[:, :6], _positions(2, 0, 6), cache, logits_at="all")
        assert cache.lengths.tolist() == [0, 0]  # the forward never moves lengths
        cache.advance(None, torch.tensor([6, 6]))
        steps = [out.logits]
        for t in range(6, 11):
            steps.append(ours(tokens[:, t:t + 1], _positions(2, t, 1), cache, logits_at="all").logits)
            cache.advance(None, 1)
    assert torch.allclose(torch.cat(steps, 1), ref, atol=1e-5)


def test_chunked_prefill_equals_one_prefill():
    ours = our_model("mistral")
    tokens = _tokens(1, 13, seed=4)
    ref = full_logits(ours, tokens)
    cache = ours.new_cache(1, 16)
    with torch.inference_mode():
        a = ours(tokens[:, :5], _positions(1, 0, 5), cache, logits_at="all").logits
        cache.advance(None, 5)
        b = ours(tokens[:, 5:], _positions(1, 5, 8), cache, logits_at="all").logits
    assert torch.allclose(torch.cat([a, b], 1), ref, atol=1e-5)


# A hand-made 7-node tree:      0
#                             /   \
#                            1     2
#                           / \     \
#                          3   4     5
#                          |
#                          6
PARENTS = [-1, 0, 0, 1, 1, 2, 3]
DEPTH = [0, 1, 1, 2, 2, 2, 3]


def _ancestor_mask(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def _branch(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tree_block_matches_causal_branches(family):
    ours = our_model(family)
    prefix = _tokens(1, 5, seed=5)
    nodes = _tokens(1, 7, seed=6)
    cache = ours.new_cache(1, 16)
    with torch.inference_mode():
        ours(prefix, _positions(1, 0, 5), cache)
        cache.advance(None, 5)
        positions = 5 + torch.tensor([DEPTH])
        tree = ours(nodes, positions, cache, block_mask=_ancestor_mask(PARENTS)[None], logits_at="all").logits
    assert cache.lengths.tolist() == [5]
    for node in range(7):
        branch = nodes[:, _branch(PARENTS, node)]
        ref = full_logits(ours, torch.cat([prefix, branch], 1))[:, -1]
        assert torch.allclose(tree[:, node], ref, atol=1e-5), node


def test_ragged_tree_batch_with_padding_nodes():
    """Two rows with different prefixes and trees; row 1's last two nodes are padding (see only themselves)."""
    ours = our_model("llama")
    prefixes = [_tokens(1, 4, seed=7), _tokens(1, 9, seed=8)]
    nodes = _tokens(2, 7, seed=9)
    parents = [PARENTS, [-1, 0, 1, 0, 3, -1, -1]]
    depth = [DEPTH, [0, 1, 2, 1, 2, 0, 0]]
    mask = torch.stack([_ancestor_mask(p) for p in parents])
    cache = ours.new_cache(3, 20)
    rows = torch.tensor([2, 0])
    with torch.inference_mode():
        for r, p in zip(rows.tolist(), prefixes):
            ours(p, _positions(1, 0, p.shape[1]), cache, rows=torch.tensor([r]))
            cache.advance(torch.tensor([r]), torch.tensor([p.shape[1]]))
        prefix_len = torch.tensor([4, 9])
        positions = prefix_len[:, None] + torch.tensor(depth)
        out = ours(nodes, positions, cache, rows=rows, block_mask=mask, logits_at="all").logits
    assert torch.isfinite(out).all()
    for b in range(2):
        for node in range(7 if b == 0 else 5):
            branch = nodes[b:b + 1, _branch(parents[b], node)]
            ref = full_logits(ours, torch.cat([prefixes[b], branch], 1))[:, -1]
            assert torch.allclose(out[b, node], ref[0], atol=1e-5), (b, node)


def test_wide_block_mask_adds_tree_levels_incrementally():
    """block_mask [B, T, W > T]: the T new tokens are the last T of W uncommitted block slots."""
    ours = our_model("llama")
    prefix_lens = [4, 6]
    prefixes = [_tokens(1, n, seed=20 + n) for n in prefix_lens]
    nodes = _tokens(2, 7, seed=19)
    mask = _ancestor_mask(PARENTS).expand(2, 7, 7)
    positions = torch.tensor(prefix_lens)[:, None] + torch.tensor([DEPTH])
    cache = ours.new_cache(2, 16)
    with torch.inference_mode():
        for b, p in enumerate(prefixes):
            ours(p, _positions(1, 0, p.shape[1]), cache, rows=torch.tensor([b]))
        cache.advance(None, torch.tensor(prefix_lens))
        first = ours(nodes[:, :3], positions[:, :3], cache, block_mask=mask[:, :3, :3], logits_at="all").logits
        second = ours(nodes[:, 3:], positions[:, 3:], cache, block_mask=mask[:, 3:, :], logits_at="all").logits
    assert cache.lengths.tolist() == prefix_lens
    got = torch.cat([first, second], 1)
    for b in range(2):
        for node in range(7):
            branch = nodes[b:b + 1, _branch(PARENTS, node)]
            ref = full_logits(ours, torch.cat([prefixes[b], branch], 1))[0, -1]
            assert torch.allclose(got[b, node], ref, atol=1e-5), (b, node)
    with pytest.raises(ValueError, match="block slots"):
        ours(nodes[:, :3], positions[:, :3], cache, block_mask=mask[:, :3, :2])


def test_ragged_batch_equals_each_sequence_alone():
    """Right-padded prompts of different lengths, then decode blocks committing different counts per row."""
    ours = our_model("qwen3")
    lengths = [3, 8, 5]
    seqs = [_tokens(1, 14, seed=10 + i)[0] for i in range(3)]
    cache = ours.new_cache(3, 24)
    padded = torch.stack([torch.where(torch.arange(8) < n, s[:8], 0) for s, n in zip(seqs, lengths)])
    got: list[list[torch.Tensor]] = [[], [], []]
    with torch.inference_mode():
        out = ours(padded, _positions(3, 0, 8), cache, logits_at=torch.tensor(lengths)[:, None] - 1).logits
        for b in range(3):
            got[b].append(out[b, 0])
        cache.advance(None, torch.tensor(lengths))
        done = list(lengths)
        for counts in ([1, 3, 2], [2, 1, 3]):  # tokens each row commits from a 3-token causal block
            block = torch.stack([s[n:n + 3] for s, n in zip(seqs, done)])
            positions = torch.tensor(done)[:, None] + torch.arange(3)
            out = ours(block, positions, cache, logits_at="all").logits
            for b, c in enumerate(counts):
                got[b].extend(out[b, :c])
                done[b] += c
            cache.advance(None, torch.tensor(counts))
    assert cache.lengths.tolist() == done
    for b in range(3):
        ref = full_logits(ours, seqs[b][None, :done[b]])[0, lengths[b] - 1:]
        assert torch.allclose(torch.stack(got[b]), ref, atol=1e-5), b


@pytest.mark.parametrize("rows", [[3, 1], [1, 2]])
def test_rows_subset_of_larger_cache(rows):
    ours = our_model("llama_tied")
    tokens = _tokens(2, 9, seed=11)
    ref = full_logits(ours, tokens)
    cache = ours.new_cache(4, 12)
    cache.advance(torch.tensor([0]), torch.tensor([7]))  # an unrelated busy row
    r = torch.tensor(rows)
    with torch.inference_mode():
        a = ours(tokens[:, :6], _positions(2, 0, 6), cache, rows=r, logits_at="all").logits
        cache.advance(r, torch.tensor([6, 6]))
        b = ours(tokens[:, 6:], _positions(2, 6, 3), cache, rows=r, logits_at="all").logits
    assert torch.allclose(torch.cat([a, b], 1), ref, atol=1e-5)
    assert cache.lengths[0].item() == 7


def test_rollback_then_redecode():
    ours = our_model("llama3_rope")
    prompt, first, second = _tokens(1, 6, seed=12), _tokens(1, 3, seed=13), _tokens(1, 4, seed=14)
    cache = ours.new_cache(1, 16)
    with torch.inference_mode():
        ours(prompt, _positions(1, 0, 6), cache)
        cache.advance(None, 6)
        ours(first, _positions(1, 6, 3), cache)
        cache.advance(None, 3)
        cache.rollback(None, torch.tensor([6]))
        got = ours(second, _positions(1, 6, 4), cache, logits_at="all").logits
    ref = full_logits(ours, torch.cat([prompt, second], 1))[:, 6:]
    assert torch.allclose(got, ref, atol=1e-5)


def test_compaction_equals_decoding_only_the_kept_tokens():
    ours = our_model("qwen2")
    prefix, nodes, nxt = _tokens(2, 5, seed=15), _tokens(2, 7, seed=16), _tokens(2, 1, seed=17)
    path = torch.tensor([[0, 2, 5], [0, 1, 3]])  # accepted root-to-node paths in the 7-node tree
    counts = torch.tensor([3, 2])  # row 1 keeps only nodes 0, 1
    cache = ours.new_cache(2, 20)
    with torch.inference_mode():
        ours(prefix, _positions(2, 0, 5), cache)
        cache.advance(None, 5)
        ours(nodes, 5 + torch.tensor([DEPTH, DEPTH]), cache, block_mask=_ancestor_mask(PARENTS).expand(2, 7, 7))
        cache.compact(None, 5 + path, counts)
        assert cache.lengths.tolist() == [8, 7]
        got = [ours(nxt[b:b + 1], torch.tensor([[int(cache.lengths[b])]]), cache, rows=torch.tensor([b]),
                    logits_at="all").logits[0, 0] for b in range(2)]
    for b in range(2):
        kept = nodes[b, path[b, : counts[b]]]
        ref = full_logits(ours, torch.cat([prefix[b], kept, nxt[b]])[None])[0, -1]
        assert torch.allclose(got[b], ref, atol=1e-5), b


# ============================================================================================= refusals
def test_context_overflow():
    ours = our_model("llama")
    cache = ours.new_cache(2, 8)
    with pytest.raises(ContextOverflowError, match=r"row 0 needs 9 .* max_len is 8"):
        ours(_tokens(1, 9), _positions(1, 0, 9), cache)
    cache.advance(None, torch.tensor([2, 7]))
    ours(_tokens(2, 1), torch.tensor([[2], [7]]), cache)  # exactly fills row 1
    with pytest.raises(ContextOverflowError, match=r"row 1 needs 9"):
        ours(_tokens(2, 2), torch.tensor([[2, 3], [7, 8]]), cache)


def test_sliding_window_refuses_longer_contexts():
    ours = our_model("mistral")  # window 64
    assert ours.args.sliding_window == 64
    cache = ours.new_cache(1, 80)
    ours(_tokens(1, 64), _positions(1, 0, 64), cache)
    with pytest.raises(ContextOverflowError, match="sliding window"):
        ours(_tokens(1, 65), _positions(1, 0, 65), cache)


def test_unsupported_models_are_refused():
    from transformers import GPT2Config

    with pytest.raises(UnsupportedModelError) as err:
        ModelArgs.from_hf_config(GPT2Config())
    for name in ("llama", "mistral", "qwen2", "qwen3", "LlamaForCausalLM"):
        assert name in str(err.value)
    cfg = dict(hf_model("llama").config.to_dict())
    with pytest.raises(UnsupportedModelError, match="rope type 'yarn'"):
        ModelArgs.from_hf_config({**cfg, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}})
    with pytest.raises(UnsupportedModelError, match="hidden_act"):
        ModelArgs.from_hf_config({**cfg, "hidden_act": "gelu"})


def test_config_parsing_v4_and_v5_fields():
    v4 = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 32, "rope_theta": 500000.0,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    a = ModelArgs.from_hf_config(v4)
    assert (a.rope_type, a.rope_theta, a.rope_factor, a.rope_original_max_position) == ("llama3", 5e5, 8.0, 8192)
    assert a.num_key_value_heads == 4 and a.head_dim == 16 and a.sliding_window is None
    linear = ModelArgs.from_hf_config({**v4, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert (linear.rope_type, linear.rope_factor) == ("linear", 2.0)
    assert ModelArgs.from_hf_config({**v4, "rope_scaling": None}).rope_type == "default"
    v5 = our_model("llama3_rope").args
    assert (v5.rope_type, v5.rope_factor, v5.rope_original_max_position) == ("llama3", 8.0, 64)
    q3 = our_model("qwen3").args
    assert q3.head_dim == 24 and q3.qk_norm and not q3.attention_bias
    q2 = our_model("qwen2").args
    assert q2.attention_bias and not q2.o_proj_bias and q2.tie_word_embeddings and q2.sliding_window is None
    qwin = ModelArgs.from_hf_config(
        {**hf_model("qwen2").config.to_dict(), "layer_types": ["sliding_attention"] * 3, "sliding_window": 32})
    assert qwin.sliding_window == 32


def test_strict_state_dict():
    hf = hf_model("qwen2")
    args = ModelArgs.from_hf_config(hf.config)
    sd = dict(hf.state_dict())
    missing = {k: v for k, v in sd.items() if k != "model.layers.1.self_attn.k_proj.bias"}
    with pytest.raises(StateDictMismatchError, match=r"missing.*model\.layers\.1\.self_attn\.k_proj\.bias"):
        Transformer.from_state_dict(args, missing)
    bad = {**sd, "model.layers.0.mlp.up_proj.weight": torch.zeros(3, 64)}
    with pytest.raises(StateDictMismatchError, match=r"mis-shaped.*up_proj\.weight: got \(3, 64\)"):
        Transformer.from_state_dict(args, bad)
    extra = {**sd, "model.layers.0.self_attn.o_proj.bias": torch.zeros(64)}
    with pytest.raises(StateDictMismatchError, match=r"unexpected.*o_proj\.bias"):
        Transformer.from_state_dict(args, extra)
    untied = {**sd, "lm_head.weight": torch.zeros(VOCAB, 64)}  # tied config, but a different head
    with pytest.raises(StateDictMismatchError, match="tie_word_embeddings"):
        Transformer.from_state_dict(args, untied)


def test_shared_embeddings_and_head():
    tied, untied = our_model("llama_tied"), our_model("llama")
    assert tied.lm_head_weight is tied.embed_tokens.weight
    assert untied.lm_head_weight.shape == (VOCAB, 64)
    assert torch.equal(untied.lm_head_weight, hf_model("llama").lm_head.weight)
    assert torch.equal(tied.embed_tokens.weight, hf_model("llama_tied").model.embed_tokens.weight)


# ============================================================================================ precision
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bf16_close_to_fp32_and_to_hf_bf16(family):
    fp32, bf16 = our_model(family), our_model(family, torch.bfloat16)
    tokens = _tokens(2, 10, seed=18)
    ref = full_logits(fp32, tokens)
    got = full_logits(bf16, tokens)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() < 0.1 * scale
    hf16 = copy.deepcopy(hf_model(family)).to(torch.bfloat16)
    with torch.inference_mode():
        hf_logits = hf16(tokens).logits.float()
    # both run bf16 arithmetic (fp32 norms); they differ only by rounding order, far less than bf16 vs fp32
    assert (got - hf_logits).abs().max().item() < 0.1 * scale
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() > 0.8


def test_rotary_tables_stay_float32_after_dtype_casts():
    from eaglespec.runtime.model import Rotary

    rotary = Rotary(our_model("llama").args)
    cos = rotary.cos.clone()
    rotary.to(torch.bfloat16)
    assert rotary.cos.dtype == torch.float32 and torch.equal(rotary.cos, cos)
    c, s = rotary(torch.tensor([[0, 3]]), torch.bfloat16)
    assert c.shape == (1, 2, 1, 16) and c.dtype == torch.bfloat16 and s.dtype == torch.bfloat16


@pytest.mark.parametrize("mask_shape", [None, (2, 1, 5, 9), (1, 1, 5, 9), (5, 9), (2, 6, 5, 9), "causal"])
def test_grouped_attention_without_the_fused_kernel_equals_it(mask_shape):
    """The layouts a GPU takes when SDPA's grouped-head kernel cannot run (float32, masks): query groups folded
    into rows, or kv heads repeated; both equal SDPA's own grouped attention (forced here on the CPU)."""
    import torch.nn.functional as F

    from eaglespec.runtime.model import grouped_sdpa

    g = torch.Generator().manual_seed(0)
    n_q = 9 if mask_shape == "causal" else 5
    q = torch.randn(2, 6, n_q, 8, generator=g, dtype=torch.float64)  # 6 query heads over 2 kv heads
    k, v = (torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(2))
    mask = None if mask_shape in (None, "causal") else torch.rand(mask_shape, generator=g) > 0.3
    if mask is not None:
        mask[..., 0] = True  # every query sees a key
    causal = mask_shape == "causal"
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
    got = grouped_sdpa(q, k, v, mask, is_causal=causal, fused_gqa=False)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    wrong = grouped_sdpa(q, k.flip(1), v.flip(1), mask, is_causal=causal, fused_gqa=False)
    assert not torch.allclose(wrong, want)  # the kv head a query group reads matters
