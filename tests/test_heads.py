"""Draft heads: shapes, the cache contract, tree masks, an independent by-hand oracle, strict save/load,
gradients. Tiny random target (HF LlamaForCausalLM, hidden 64, 4 layers, vocab 128), CPU, seeded."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglespec.spec.heads import (
    DraftHead,
    HeadConfig,
    HeadLoadError,
    default_feature_layer_ids,
    feature_ids_to_hf,
    load_head,
    save_head,
)
from eaglespec.runtime.model import Transformer
from helpers import tiny_llama_transformer

V, H, L, DRAFT_V = 128, 64, 4, 96


@pytest.fixture(scope="module")
def target() -> Transformer:
    return tiny_llama_transformer(V, H, L)


def make_head(target: Transformer, kind: str, layers: int = 1, seed: int = 1) -> DraftHead:
    """A head with every weight random (norm weights around 1) and, for EAGLE-3, a shuffled draft vocab."""
    torch.manual_seed(seed)
    head = DraftHead.for_target(target, kind, num_layers=layers, draft_vocab_size=DRAFT_V if kind == "eagle3" else None)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    if kind == "eagle3":
        head.set_draft_vocab(torch.randperm(V)[:DRAFT_V])
    return head


def target_features(target: Transformer, head: DraftHead, tokens: torch.Tensor) -> torch.Tensor:
    """[B, T, F] the head's input features from a target forward over `tokens` (fresh cache)."""
    batch, n = tokens.shape
    with torch.no_grad():
        out = target(tokens, torch.arange(n).expand(batch, n), target.new_cache(batch, n),
                     hidden_indices=head.hidden_indices)
    return head.target_feature(out)


def rewrite(src: Path, dst: Path, config: Callable[[dict], Any] | None = None,
            tensors: Callable[[dict], Any] | None = None) -> Path:
    """Copy a saved head, editing config.json / the tensor dict in place on the way."""
    cfg = json.loads((src / "config.json").read_text())
    sd = load_file(str(src / "model.safetensors"))
    if config:
        config(cfg)
    if tensors:
        tensors(sd)
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    save_file(sd, str(dst / "model.safetensors"))
    return dst


KINDS_LAYERS = [("eagle1", 1), ("eagle1", 2), ("eagle3", 1), ("eagle3", 2)]


# ------------------------------------------------------------------------------------------------ config
def test_config_for_target_and_feature_conventions(target):
    args = target.args
    c3 = HeadConfig.for_target(args, "eagle3", draft_vocab_size=DRAFT_V)
    assert c3.feature_layer_ids == (1, 2, 3)  # (2, L//2, L-3) = (2, 2, 1) collides at L = 4
    assert c3.feature_size == 3 * H and c3.out_vocab_size == DRAFT_V and not c3.bias
    assert default_feature_layer_ids(30) == (2, 15, 27)  # SmolLM2-135M
    assert len(set(default_feature_layer_ids(6))) == 3 and len(set(default_feature_layer_ids(3))) == 3
    c1 = HeadConfig.for_target(args, "eagle1")
    assert c1.feature_layer_ids == () and c1.bias and c1.out_vocab_size == V and c1.feature_size == H
    # vLLM "input of layer k" = our index; SpecForge/ModelOpt "output of layer k" = our index - 1
    assert feature_ids_to_hf([2, 15, 27], "input_of_layer") == (2, 15, 27)
    assert feature_ids_to_hf([1, 14, 26], "output_of_layer") == (2, 15, 27)
    # RoPE scaling of the target is carried over through ModelArgs
    scaled = args.replace(rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                          rope_original_max_position=1024, rope_theta=500000.0)
    la = HeadConfig.for_target(scaled, "eagle3").layer_args
    assert (la.rope_type, la.rope_factor, la.rope_original_max_position, la.rope_theta) == \
        ("llama3", 8.0, 1024, 500000.0)
    with pytest.raises(ValueError, match="feature_layer_ids"):
        HeadConfig.for_target(args, "eagle3", feature_layer_ids=(1, 1, 3))
    with pytest.raises(ValueError, match="outside"):
        HeadConfig.for_target(args, "eagle3", feature_layer_ids=(1, 2, 5))
    with pytest.raises(ValueError, match="rope"):
        HeadConfig(**{**c1.__dict__, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


# ------------------------------------------------------------------------------------------------ forward
@pytest.mark.parametrize("kind,layers", KINDS_LAYERS)
def test_forward_shapes(target, kind, layers):
    head = make_head(target, kind, layers)
    tokens = torch.randint(0, V, (2, 5))
    feats = target_features(target, head, tokens)
    assert feats.shape == (2, 5, head.config.feature_size)
    assert head.hidden_indices == ((1, 2, 3) if kind == "eagle3" else ())
    h = head.fuse(feats)
    cache = head.new_cache(2, 16)
    assert cache.n_layers == layers
    out = head(h, tokens, torch.arange(5).expand(2, 5), cache)
    assert out.shape == (2, 5, H) and out.dtype == torch.float32
    assert torch.equal(cache.lengths, torch.zeros(2, dtype=torch.int64))  # lengths are not moved
    logits = head.logits(out)
    assert logits.shape == (2, 5, head.config.out_vocab_size) and logits.dtype == torch.float32
    ids = head.to_target_ids(logits.argmax(-1))
    assert ids.shape == (2, 5) and int(ids.max()) < V
    if kind == "eagle3":
        assert head.t2d[ids].all() and int(head.t2d.sum()) == DRAFT_V


@pytest.mark.parametrize("kind,layers", KINDS_LAYERS)
def test_prefill_then_steps_equals_full_forward(target, kind, layers):
    """Cache contract: prefill + single-token steps (advancing lengths) == one forward over everything,
    also when the batch lives in non-contiguous cache rows."""
    head = make_head(target, kind, layers)
    torch.manual_seed(2)
    tokens, n = torch.randint(0, V, (2, 7)), 7
    h = torch.randn(2, n, H)
    positions = torch.arange(n).expand(2, n)
    with torch.no_grad():
        full = head(h, tokens, positions, head.new_cache(2, 16))
        cache, rows = head.new_cache(3, 16), torch.tensor([2, 0])
        parts = [head(h[:, :3], tokens[:, :3], positions[:, :3], cache, rows=rows)]
        cache.advance(rows, 3)
        for t in range(3, n):
            parts.append(head(h[:, t:t + 1], tokens[:, t:t + 1], positions[:, t:t + 1], cache, rows=rows))
            cache.advance(rows, 1)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.lengths.tolist() == [n, 0, n]


@pytest.mark.parametrize("kind,layers", [("eagle1", 2), ("eagle3", 1), ("eagle3", 2)])
def test_block_mask_branch_equals_causal_path(target, kind, layers):
    """Each node of a tree block sees the committed prefix and its ancestors only: its output equals a causal
    forward over its root-to-node branch."""
    head = make_head(target, kind, layers)
    torch.manual_seed(3)
    prefix = 4
    parents = [-1, 0, 0, 1, 1, 2]  # 6 nodes: root, two children, three grandchildren
    depth = [0, 1, 1, 2, 2, 2]
    n = len(parents)
    mask = torch.zeros(1, n, n, dtype=torch.bool)  # hand-written ancestor-or-self mask
    for i in range(n):
        j = i
        while j >= 0:
            mask[0, i, j] = True
            j = parents[j]
    tokens, h = torch.randint(0, V, (1, prefix + n)), torch.randn(1, prefix + n, H)
    cache = head.new_cache(1, 32)
    with torch.no_grad():
        head(h[:, :prefix], tokens[:, :prefix], torch.arange(prefix)[None], cache)
        cache.advance(None, prefix)
        positions = (prefix + torch.tensor(depth))[None]
        tree_out = head(h[:, prefix:], tokens[:, prefix:], positions, cache, block_mask=mask)
        for i in range(n):
            path = []
            j = i
            while j >= 0:
                path.insert(0, j)
                j = parents[j]
            idx = prefix + torch.tensor(path)
            branch = head(h[:, idx], tokens[:, idx], (prefix + torch.arange(len(path)))[None], cache)
            torch.testing.assert_close(tree_out[:, i], branch[:, -1], atol=1e-5, rtol=1e-5)
    assert cache.lengths.tolist() == [prefix]


def _plan_supports_wide_blocks() -> bool:
    """model.py's contract for block_mask [B, T, W > T]: the T new tokens are the last T of W block slots,
    so attention spans prefix + W slots."""
    from eaglespec.runtime.kvcache import KVCache
    from eaglespec.runtime.model import plan_attention

    try:
        plan = plan_attention(KVCache(1, 1, 1, 8, 4), 1, block_mask=torch.ones(1, 1, 3, dtype=torch.bool))
    except (RuntimeError, ValueError, IndexError):
        return False
    return plan.n_slots == 3


@pytest.mark.skipif(not _plan_supports_wide_blocks(), reason="plan_attention does not support W > T yet")
@pytest.mark.parametrize("kind,layers", [("eagle1", 2), ("eagle3", 1)])
def test_wide_block_mask_level_by_level(target, kind, layers):
    """Tree drafting level by level: earlier drafted (uncommitted) nodes stay in the block region and each new
    level sees them only where block_mask allows; every node equals a causal forward over its branch."""
    head = make_head(target, kind, layers)
    torch.manual_seed(6)
    prefix = 3
    # nodes: 0 = root; 1, 2 = its children; 3 = child of 2. Block slot of node i = prefix + i.
    branches = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 2, 3]}
    levels = [([0], [[1]]), ([1, 2], [[1, 1, 0], [1, 0, 1]]), ([3], [[1, 0, 1, 1]])]  # (nodes, mask rows over W)
    tokens, h = torch.randint(0, V, (1, prefix + 4)), torch.randn(1, prefix + 4, H)
    depth = {0: 0, 1: 1, 2: 1, 3: 2}
    cache = head.new_cache(1, 16)
    with torch.no_grad():
        head(h[:, :prefix], tokens[:, :prefix], torch.arange(prefix)[None], cache)
        cache.advance(None, prefix)
        got = {}
        for nodes, rows in levels:
            idx = prefix + torch.tensor(nodes)
            mask = torch.tensor(rows, dtype=torch.bool)[None]  # [1, T, W]
            positions = prefix + torch.tensor([depth[i] for i in nodes])[None]
            out = head(h[:, idx], tokens[:, idx], positions, cache, block_mask=mask)
            got |= {node: out[:, t] for t, node in enumerate(nodes)}
        for node, path in branches.items():
            ref_cache = head.new_cache(1, 16)
            head(h[:, :prefix], tokens[:, :prefix], torch.arange(prefix)[None], ref_cache)
            ref_cache.advance(None, prefix)
            idx = prefix + torch.tensor(path)
            ref = head(h[:, idx], tokens[:, idx], (prefix + torch.arange(len(path)))[None], ref_cache)
            torch.testing.assert_close(got[node], ref[:, -1], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------- the oracle
def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [T, heads, D]; rotate pairs (i, i + D/2) by pos * theta^(-2i/D)."""
    d = x.shape[-1]
    angle = pos[:, None].double() * theta ** (-torch.arange(0, d, 2).double() / d)  # [T, D/2]
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _layer_by_hand(w: dict, p: str, attn_in: torch.Tensor, resid: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One decoder layer with plain ops: causal GQA attention (4 heads, 2 kv heads, D 16) + SwiGLU."""
    n, nh, nkv, d = attn_in.shape[0], 4, 2, 16
    q = _rope((attn_in @ w[p + "self_attn.q_proj.weight"].T).view(n, nh, d), pos, 10000.0)
    k = _rope((attn_in @ w[p + "self_attn.k_proj.weight"].T).view(n, nkv, d), pos, 10000.0)
    v = (attn_in @ w[p + "self_attn.v_proj.weight"].T).view(n, nkv, d)
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)  # q head i -> kv head i//2
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, nh * d)
    x = resid + attn @ w[p + "self_attn.o_proj.weight"].T
    y = _rms(x, w[p + "post_attention_layernorm.weight"])
    gate, up = y @ w[p + "mlp.gate_proj.weight"].T, y @ w[p + "mlp.up_proj.weight"].T
    return x + (gate * torch.sigmoid(gate) * up) @ w[p + "mlp.down_proj.weight"].T


@pytest.mark.parametrize("kind", ["eagle3", "eagle1"])
def test_one_layer_head_matches_hand_computation(target, kind, tmp_path):
    """Recompute a saved 1-layer head from its files with plain float64 ops (norms, cat order embedding
    first, EAGLE-3 residual = raw fused feature, EAGLE-1 first layer without input norm) and compare."""
    head = make_head(target, kind, 1)
    save_head(head, tmp_path / "h")
    w = {k: v.double() for k, v in load_file(str(tmp_path / "h" / "model.safetensors")).items()}
    torch.manual_seed(4)
    n = 6
    tokens = torch.randint(0, V, (1, n))
    feats = target_features(target, head, tokens)
    with torch.no_grad():
        out = head(head.fuse(feats), tokens, torch.arange(n)[None], head.new_cache(1, n))
        logits = head.logits(out)

    emb = target.embed_tokens.weight.double()[tokens[0]]  # [T, H]
    f, pos = feats[0].double(), torch.arange(n)
    if kind == "eagle3":
        h = f @ w["fc.weight"].T  # fuse [low | mid | high]
        attn_in = torch.cat((_rms(emb, w["midlayer.input_layernorm.weight"]), _rms(h, w["midlayer.hidden_norm.weight"])), -1)
        x = _layer_by_hand(w, "midlayer.", attn_in, h, pos)
        want_logits = _rms(x, w["norm.weight"]) @ w["lm_head.weight"].T
        draft_ids = torch.arange(DRAFT_V)
        assert torch.equal(head.to_target_ids(draft_ids), draft_ids + w["d2t"].long())
    else:
        x0 = torch.cat((emb, f), -1) @ w["fc.weight"].T + w["fc.bias"]
        x = _layer_by_hand(w, "layers.0.", x0, x0, pos)
        want_logits = x @ target.lm_head_weight.double().T
    torch.testing.assert_close(out[0].double(), x, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[0].double(), want_logits, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------- save / load
def _layer_names(prefix: str, input_norm: bool = True, hidden_norm: bool = False) -> list[str]:
    names = [prefix + n for n in ("mlp.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                  "post_attention_layernorm.weight", "self_attn.k_proj.weight",
                                  "self_attn.o_proj.weight", "self_attn.q_proj.weight", "self_attn.v_proj.weight")]
    return names + [prefix + "input_layernorm.weight"] * input_norm + [prefix + "hidden_norm.weight"] * hidden_norm


SAVED_TENSORS = {  # the on-disk names vLLM, SGLang and llama.cpp read: written out by hand, never derived
    "eagle1": ["fc.bias", "fc.weight", *_layer_names("layers.0.", input_norm=False), *_layer_names("layers.1.")],
    "eagle3": ["d2t", "fc.weight", "lm_head.weight", "norm.weight", "t2d",
               *_layer_names("midlayer.", hidden_norm=True), *_layer_names("layers.1.")],
}


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_saved_tensor_names_are_the_public_format(target, kind, tmp_path):
    """Two-layer heads save exactly these tensor names (a public format: renaming a module breaks other engines)."""
    save_head(make_head(target, kind, 2), tmp_path / "h")
    assert sorted(load_file(str(tmp_path / "h" / "model.safetensors"))) == sorted(SAVED_TENSORS[kind])


@pytest.mark.parametrize("kind,layers", KINDS_LAYERS)
def test_save_load_round_trip(target, kind, layers, tmp_path):
    head = make_head(target, kind, layers)
    save_head(head, tmp_path / "h")
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    names = set(load_file(str(tmp_path / "h" / "model.safetensors")))
    assert not any("embed" in n for n in names)  # shared tensors are not saved
    if kind == "eagle3":
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == DRAFT_V
        assert {"fc.weight", "midlayer.hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
        assert ("layers.1.input_layernorm.weight" in names) == (layers == 2) and "fc.bias" not in names
        assert not any(n.startswith("layers.0.") for n in names)
        assert cfg["eaglespec"]["feature_layer_ids"] == [1, 2, 3] == cfg["eagle_aux_hidden_state_layer_ids"]
        assert cfg["eaglespec"]["feature_layer_convention"] == "hf_hidden_states_index"
    else:
        assert cfg["architectures"] == ["EagleLlamaForCausalLM"] and cfg["bias"] is True
        assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight"} <= names
        assert "layers.0.input_layernorm.weight" not in names and "lm_head.weight" not in names
    assert cfg["num_hidden_layers"] == layers and cfg["vocab_size"] == V

    loaded = load_head(tmp_path / "h", target)
    assert loaded.config == head.config
    tokens = torch.randint(0, V, (2, 5))
    h = head.fuse(target_features(target, head, tokens))
    pos = torch.arange(5).expand(2, 5)
    with torch.no_grad():
        a = head.logits(head(h, tokens, pos, head.new_cache(2, 8)))
        b = loaded.logits(loaded(h, tokens, pos, loaded.new_cache(2, 8)))
    assert torch.equal(a, b)
    assert torch.equal(head.to_target_ids(torch.arange(head.config.out_vocab_size)),
                       loaded.to_target_ids(torch.arange(head.config.out_vocab_size)))


def _to_speculators(cfg: dict) -> None:
    layer_keys = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "num_hidden_layers", "hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling",
                  "max_position_embeddings", "vocab_size", "model_type"]
    layer = {k: cfg.pop(k) for k in layer_keys}
    ids = cfg["eaglespec"]["feature_layer_ids"]
    cfg.clear()
    cfg |= {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": layer, "draft_vocab_size": DRAFT_V, "norm_before_residual": False,
            "target_hidden_size": H, "eagle_aux_hidden_state_layer_ids": ids,
            "speculators_config": {"algorithm": "eagle3", "verifier": {"architectures": ["LlamaForCausalLM"]}}}


def _rename(sd: dict, old: str, new: str) -> None:
    for name in [n for n in sd if n.startswith(old)]:
        sd[new + name[len(old):]] = sd.pop(name)


def test_speculators_layout_and_stored_embedding_are_accepted(target, tmp_path):
    head = make_head(target, "eagle3", 1)
    src = save_head(head, tmp_path / "h")
    spec = rewrite(src, tmp_path / "spec", config=_to_speculators,
                   tensors=lambda sd: _rename(sd, "midlayer.", "layers.0."))
    embed = rewrite(src, tmp_path / "embed", tensors=lambda sd: sd.update(
        {"embed_tokens.weight": target.embed_tokens.weight.clone()}))
    tokens = torch.randint(0, V, (1, 4))
    h = head.fuse(target_features(target, head, tokens))
    with torch.no_grad():
        want = head(h, tokens, torch.arange(4)[None], head.new_cache(1, 4))
        for d in (spec, embed):
            loaded = load_head(d, target)
            assert loaded.config == head.config
            assert torch.equal(loaded(h, tokens, torch.arange(4)[None], loaded.new_cache(1, 4)), want)


def test_reference_style_eagle1_is_accepted(target, tmp_path):
    """EAGLE reference heads: architectures ["LlamaForCausalLM"], no eaglespec metadata, embedding stored."""
    head = make_head(target, "eagle1", 1)
    src = save_head(head, tmp_path / "h")

    def reference_config(cfg: dict) -> None:
        cfg["architectures"] = ["LlamaForCausalLM"]
        del cfg["eaglespec"]

    ref = rewrite(src, tmp_path / "ref", config=reference_config,
                  tensors=lambda sd: sd.update({"embed_tokens.weight": target.embed_tokens.weight.clone()}))
    loaded = load_head(ref, target)
    assert loaded.config == head.config
    for name, t in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def edit(cfg: dict) -> None:
        *parents, key = path.split(".")
        for p in parents:
            cfg = cfg[p]
        cfg[key] = value
    return edit


def _d2t_duplicate(sd: dict) -> None:
    sd["d2t"][1] = sd["d2t"][0] - 1  # draft ids 0 and 1 -> the same target id


REFUSALS = [
    # (kind, config edit, tensor edit, words the message must contain)
    ("eagle3", None, lambda sd: sd.pop("midlayer.hidden_norm.weight"), ["missing", "midlayer.hidden_norm.weight"]),
    ("eagle3", None, lambda sd: sd.update({"midlayer.self_attn.q_proj.bias": torch.zeros(64)}),
     ["unexpected", "midlayer.self_attn.q_proj.bias"]),
    ("eagle3", None, lambda sd: sd.update({"fc.weight": torch.zeros(64, 128)}), ["fc.weight", "(64, 128)", "(64, 192)"]),
    ("eagle3", None, lambda sd: sd.update({"lm_head.weight": torch.zeros(V, 64)}), ["lm_head.weight", "mis-shaped"]),
    ("eagle3", None, lambda sd: _rename(sd, "midlayer.", "layers.0."), ["renamed layout", "layers.0.*", "midlayer.*"]),
    ("eagle3", _to_speculators, None, ["renamed layout", "midlayer.*", "layers.0.*"]),
    ("eagle1", None, lambda sd: sd.pop("fc.bias"), ["missing", "fc.bias", "bias: true"]),
    ("eagle1", None, lambda sd: sd.update({"layers.0.input_layernorm.weight": torch.ones(64)}),
     ["unexpected", "layers.0.input_layernorm.weight", "no input_layernorm"]),
    ("eagle1", None, lambda sd: _rename(sd, "layers.0.", "midlayer."), ["midlayer.*"]),
    ("eagle1", _set("architectures", ["LlamaForCausalLMEagle3"]), None, ["layers.0.*", "midlayer.*"]),
    ("eagle3", _set("architectures", ["EagleLlamaForCausalLM"]), None, ["EAGLE-1", "EAGLE-3 tensors"]),
    ("eagle3", _set("architectures", ["MedusaModel"]), None, ["architectures", "MedusaModel"]),
    ("eagle3", _set("rope_scaling", {"rope_type": "yarn", "factor": 4.0}), None, ["rope", "yarn"]),
    ("eagle1", _set("attention_bias", True), None, ["attention_bias"]),
    ("eagle3", _set("mlp_bias", True), None, ["mlp_bias"]),
    ("eagle3", _set("norm_before_residual", True), None, ["norm_before_residual"]),
    ("eagle1", _set("hidden_act", "gelu"), None, ["hidden_act", "gelu"]),
    ("eagle3", _set("model_type", "qwen3"), None, ["model_type", "qwen3"]),
    ("eagle3", _set("tie_word_embeddings", True), None, ["tie_word_embeddings"]),
    ("eagle3", _set("hidden_size", 48), None, ["hidden_size 48", "target"]),
    ("eagle3", _set("target_hidden_size", 96), None, ["target_hidden_size 96"]),
    ("eagle1", _set("vocab_size", 100), None, ["vocab_size 100"]),
    ("eagle3", _set("draft_vocab_size", 200), None, ["draft_vocab_size"]),
    ("eagle3", _set("eaglespec.feature_layer_ids", [1, 2, 9]), None, ["feature_layer_ids", "4 layers"]),
    ("eagle3", _set("eaglespec.feature_layer_convention", "middle_of_layer"), None, ["middle_of_layer"]),
    ("eagle3", _set("eaglespec.kind", "eagle1"), None, ["eaglespec.kind"]),
    ("eagle3", None, lambda sd: sd["d2t"].__setitem__(0, 10_000), ["d2t", "outside"]),
    ("eagle3", None, _d2t_duplicate, ["d2t", "same target id"]),
    ("eagle3", None, lambda sd: sd["t2d"].__setitem__(sd["t2d"].logical_not().nonzero()[0], True), ["t2d", "d2t"]),
    ("eagle3", None, lambda sd: sd.update({"d2t": sd["d2t"].float()}), ["d2t", "integer"]),
    ("eagle3", None, lambda sd: sd.update({"embed_tokens.weight": torch.zeros(V, 64)}), ["embed_tokens.weight"]),
    ("eagle3", None, lambda sd: sd["norm.weight"].__setitem__(0, float("nan")), ["norm.weight", "non-finite"]),
]


@pytest.mark.parametrize("kind,config_edit,tensor_edit,words", REFUSALS,
                         ids=[f"{i}-{r[0]}-{r[3][-1]}" for i, r in enumerate(REFUSALS)])
def test_load_refuses(target, tmp_path, kind, config_edit, tensor_edit, words):
    src = save_head(make_head(target, kind, 1), tmp_path / "h")
    bad = rewrite(src, tmp_path / "bad", config=config_edit, tensors=tensor_edit)
    with pytest.raises(HeadLoadError) as err:
        load_head(bad, target)
    for word in words:
        assert word in str(err.value), f"{word!r} not in: {err.value}"


def test_load_refuses_missing_files(target, tmp_path):
    src = save_head(make_head(target, "eagle1", 1), tmp_path / "h")
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    with pytest.raises(HeadLoadError, match="no model.safetensors.*pytorch_model.bin"):
        load_head(src, target)
    with pytest.raises(HeadLoadError, match="no config.json"):
        load_head(tmp_path / "empty", target)


# ------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_gradients_through_unrolled_steps(target, kind):
    """Two draft steps on one cache (step 2 takes step 1's output feature, attends to step 1's keys):
    every head parameter gets a gradient that matches a finite difference (float64); the shared embedding
    and target lm_head get none and are neither parameters nor saved."""
    head = make_head(target, kind, 2).double()
    assert head.rotary.cos.dtype == torch.float32  # rotary tables survive the cast
    assert all(p.requires_grad for p in head.parameters())
    shared = {id(target.embed_tokens.weight), id(target.lm_head_weight), id(head.embed_weight)}
    assert not shared & {id(p) for p in head.parameters()}
    assert not {"embed_weight", "target_lm_head"} & set(head.state_dict())

    torch.manual_seed(5)
    tokens = torch.randint(0, V, (2, 5))
    feats = target_features(target, head, tokens).double()

    def loss_fn() -> torch.Tensor:
        cache = head.new_cache(2, 16)
        pos = torch.arange(4).expand(2, 4)
        out1 = head(head.fuse(feats[:, :4]), tokens[:, :4], pos, cache)
        cache.advance(None, 4)
        out2 = head(out1, tokens[:, 1:5], pos + 1, cache)  # recurrent feature, next tokens, positions +1
        return head.logits(out1).logsumexp(-1).mean() + head.logits(out2).log_softmax(-1)[..., 3].mean()

    loss_fn().backward()
    assert target.embed_tokens.weight.grad is None and target.lm_head_weight.grad is None
    for name, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # directional derivative along a random direction (unit norm per tensor); a gradient that missed the
    # path through the cache (step 2 attending to step 1's keys) is off by > 1e-2 here
    direction = {n: (r := torch.randn_like(p)) / r.norm() for n, p in head.named_parameters()}
    analytic = sum((p.grad * direction[n]).sum() for n, p in head.named_parameters())
    eps = 1e-3  # not smaller: model.py's rms_norm computes in float32 and its rounding would dominate
    with torch.no_grad():
        values = []
        for sign in (1, -1):
            for n, p in head.named_parameters():
                p.add_(sign * eps * direction[n])
            values.append(loss_fn())
            for n, p in head.named_parameters():
                p.sub_(sign * eps * direction[n])
    numeric = (values[0] - values[1]) / (2 * eps)
    torch.testing.assert_close(numeric, analytic, rtol=1e-3, atol=1e-5)


def test_dtype_move_keeps_buffers_right(target):
    head = make_head(target, "eagle3", 1)
    tokens = torch.randint(0, V, (1, 4))
    h = head.fuse(target_features(target, head, tokens))
    with torch.no_grad():
        want = head(h, tokens, torch.arange(4)[None], head.new_cache(1, 4))
        head.to(torch.bfloat16)
        assert head.dtype == torch.bfloat16 and head.embed_weight.dtype == torch.bfloat16
        assert head.d2t.dtype == torch.int64 and head.t2d.dtype == torch.bool
        assert head.rotary.cos.dtype == torch.float32
        assert target.embed_tokens.weight.dtype == torch.float32  # the target is untouched
        cache = head.new_cache(1, 4)
        assert cache.dtype == torch.bfloat16
        got = head(h, tokens, torch.arange(4)[None], cache)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=0.05)
