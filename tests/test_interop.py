"""The layout details vLLM, speculators, SpecForge and llama.cpp depend on, pinned without installing them.

`eaglespec interop` (docs/INTEROP.md) checks the real consumers; these tests keep each detail it found
true on every commit: config keys and numbering, tensor names and dtypes, d2t/t2d, the speculators and
SpecForge exports and their round trip into `load_head`, the comparisons' arithmetic, and the refusals.
Tiny random target (hidden 64, 4 layers, vocab 128), CPU, seeded.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eaglespec.measure import interop, peers
from eaglespec.runtime.model import Transformer
from helpers import tiny_llama_transformer
from eaglespec.spec import layouts
from eaglespec.spec.heads import DraftHead, load_head, save_head

V, H, L, DRAFT_V = 128, 64, 4, 96


@pytest.fixture(scope="module")
def target() -> Transformer:
    return tiny_llama_transformer(V, H, L)


@pytest.fixture(scope="module")
def head3(target, tmp_path_factory) -> Path:
    """A saved EAGLE-3 head, bfloat16 like the shipped one, with a shuffled draft vocabulary."""
    torch.manual_seed(1)
    head = DraftHead.for_target(target, "eagle3", draft_vocab_size=DRAFT_V)
    head.set_draft_vocab(torch.randperm(V)[:DRAFT_V])
    return save_head(head.to(torch.bfloat16), tmp_path_factory.mktemp("head3"))


# ============================================================================================ vLLM
def test_saved_eagle3_config_has_the_keys_vllm_reads(head3):
    cfg = json.loads((head3 / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]  # vLLM maps it to its Eagle3LlamaForCausalLM
    assert cfg["model_type"] == "llama"
    assert cfg["draft_vocab_size"] == DRAFT_V and cfg["target_hidden_size"] == H and cfg["vocab_size"] == V
    # vLLM's "input of layer k" numbering equals our HF hidden_states index: the same numbers, top level
    assert cfg["eagle_aux_hidden_state_layer_ids"] == cfg["eaglespec"]["feature_layer_ids"]
    assert cfg["eaglespec"]["feature_layer_convention"] == "hf_hidden_states_index"
    assert "eagle_config" not in cfg  # SpecForge reads that key in ANOTHER numbering (see write_specforge)
    assert cfg["tie_word_embeddings"] is False and cfg["attention_bias"] is False and cfg["mlp_bias"] is False


def test_saved_eagle3_tensors_are_the_ones_vllm_loads(head3):
    tensors = load_file(str(head3 / "model.safetensors"))
    layer = {f"midlayer.{n}" for n in ("input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
                                        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                        "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                        "mlp.down_proj.weight")}
    assert set(tensors) == layer | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (4 * 16, 2 * H)  # attention reads cat(emb, h)
    assert tensors["fc.weight"].shape == (H, 3 * H)
    # d2t: int64 OFFSETS (target id = draft id + d2t[draft id]), which vLLM adds itself; t2d: bool membership
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    assert d2t.dtype == torch.int64 and d2t.shape == (DRAFT_V,)
    assert t2d.dtype == torch.bool and t2d.shape == (V,) and int(t2d.sum()) == DRAFT_V
    target_ids = torch.arange(DRAFT_V) + d2t
    assert t2d[target_ids].all()
    assert tensors["fc.weight"].dtype == torch.bfloat16


def test_eagle1_heads_for_vllm_need_a_bias_free_fc(target, tmp_path):
    """vLLM's EagleLlamaForCausalLM builds fc without a bias: a head trained with one cannot load there."""
    head = DraftHead.for_target(target, "eagle1", bias=False)
    d = save_head(head, tmp_path / "e1")
    cfg, tensors = json.loads((d / "config.json").read_text()), load_file(str(d / "model.safetensors"))
    assert cfg["architectures"] == ["EagleLlamaForCausalLM"] and cfg["bias"] is False
    assert "fc.bias" not in tensors and tensors["fc.weight"].shape == (H, 2 * H)
    assert "layers.0.input_layernorm.weight" not in tensors  # vLLM replaces it with an identity too


# ============================================================================================ speculators
def test_speculators_export_config_and_tensors(target, head3, tmp_path):
    out = layouts.write_speculators(head3, tmp_path / "spec", target.embed_tokens.weight, "/models/target",
                                    ["LlamaForCausalLM"], speculative_tokens=3)
    cfg = json.loads((out / "config.json").read_text())
    ours = json.loads((head3 / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["transformer_layer_config"]["model_type"] == "llama"
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 1
    assert cfg["eagle_aux_hidden_state_layer_ids"] == ours["eagle_aux_hidden_state_layer_ids"]  # not null
    assert cfg["draft_vocab_size"] == DRAFT_V and cfg["target_hidden_size"] == H
    assert not cfg["norm_before_residual"] and not cfg["norm_before_fc"] and not cfg["fc_norm"]
    verifier = cfg["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "/models/target", "architectures": ["LlamaForCausalLM"]}
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    tensors = load_file(str(out / "model.safetensors"))
    assert not any(n.startswith("midlayer.") for n in tensors)
    assert "layers.0.hidden_norm.weight" in tensors and "layers.0.self_attn.q_proj.weight" in tensors
    # the embedding is stored in the TARGET's dtype: a bfloat16 copy would not be the target's table
    assert tensors["embed_tokens.weight"].dtype == torch.float32
    assert torch.equal(tensors["embed_tokens.weight"], target.embed_tokens.weight)


def test_speculators_export_round_trips_into_load_head(target, head3, tmp_path):
    out = layouts.write_speculators(head3, tmp_path / "spec", target.embed_tokens.weight, "t", ["LlamaForCausalLM"])
    original, back = load_head(head3, target), load_head(out, target)
    assert back.config == original.config
    a, b = original.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_speculators_export_refusals(target, head3, tmp_path):
    with pytest.raises(layouts.LayoutError, match="verifier"):
        layouts.write_speculators(head3, tmp_path / "a", target.embed_tokens.weight, "", ["LlamaForCausalLM"])
    with pytest.raises(layouts.LayoutError, match="embedding table"):
        layouts.write_speculators(head3, tmp_path / "b", target.embed_tokens.weight[:, :8], "t", [])
    with pytest.raises(layouts.LayoutError, match="no config.json"):
        layouts.write_speculators(tmp_path, tmp_path / "c", target.embed_tokens.weight, "t", [])


def test_only_eagle3_heads_have_consumer_layouts(target, tmp_path):
    e1 = save_head(DraftHead.for_target(target, "eagle1"), tmp_path / "e1")
    with pytest.raises(layouts.LayoutError, match="only EAGLE-3"):
        layouts.write_specforge(e1, tmp_path / "out")


# ============================================================================================ SpecForge
def test_specforge_export_writes_capture_layers_in_its_numbering(target, head3, tmp_path):
    out = layouts.write_specforge(head3, tmp_path / "sf")
    cfg = json.loads((out / "config.json").read_text())
    ours = json.loads((head3 / "config.json").read_text())["eaglespec"]["feature_layer_ids"]
    # SpecForge captures "the output of layer k" = our HF hidden_states index minus one
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in ours]
    # what vLLM and we read stays as it was (top level wins over eagle_config in both)
    assert cfg["eagle_aux_hidden_state_layer_ids"] == ours
    assert load_head(out, target).config.feature_layer_ids == tuple(ours)
    assert (out / "model.safetensors").read_bytes() == (head3 / "model.safetensors").read_bytes()


def test_specforge_export_refuses_an_embedding_tap(target, tmp_path):
    head = DraftHead.for_target(target, "eagle3", feature_layer_ids=(0, 2, 4))  # 0 = raw embeddings
    with pytest.raises(layouts.LayoutError, match="output of a layer"):
        layouts.write_specforge(save_head(head, tmp_path / "h"), tmp_path / "out")


# ============================================================================================ the check itself
def test_probes_never_import_eaglespec():
    """They run inside the consumers' venvs, where eaglespec is not installed."""
    for path in peers.PROBES.glob("*_probe.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(name.split(".")[0] == "eaglespec" for name in names), path.name
    assert {p.name for p in peers.PROBES.glob("*_probe.py")} >= {"vllm_probe.py", "speculators_probe.py",
                                                                   "specforge_probe.py"}


def test_missing_consumer_names_the_install_command(tmp_path):
    with pytest.raises(peers.PeerError, match="is not installed.*scripts/interop.sh --setup"):
        peers.consumer_python(tmp_path, "vllm")
    with pytest.raises(peers.PeerError, match="unknown consumer 'tgi'"):
        peers.consumer_python(tmp_path, "tgi")


def test_compare_generation_counts_agreement_and_acceptance():
    vanilla = [[1, 2, 3], [4, 5, 6]]
    ours = {"outputs": [[1, 2, 3], [4, 5, 6]], "accepted_per_position": [5, 2], "rounds": 9}
    same = interop.compare_generation(vanilla, ours, [[1, 2, 3], [4, 5, 6]], [5, 2], 9)
    assert same["greedy_equal_vanilla"] == 2 and same["acceptance_equal"]
    worse = interop.compare_generation(vanilla, ours, [[1, 2, 3], [4, 5, 7]], [5], 9)
    assert worse["greedy_equal_vanilla"] == 1 and not worse["acceptance_equal"]
    assert worse["accepted_per_position"]["theirs"] == [5, 0]  # a position never accepted is padded with 0


def test_compare_state_and_step_find_a_changed_tensor():
    ours = {"midlayer.a": torch.ones(3), "fc.weight": torch.zeros(2, 2)}
    theirs = {"layers.0.a": torch.ones(3, dtype=torch.bfloat16), "fc.weight": torch.zeros(2, 2)}
    same = interop.compare_state(ours, theirs, {"midlayer.": "layers.0."})
    assert same == {"tensors": 2, "identical": 2, "differ": [], "absent": []}
    theirs["fc.weight"] = torch.eye(2)
    assert interop.compare_state(ours, theirs, {"midlayer.": "layers.0."})["differ"] == ["fc.weight"]
    assert interop.compare_state(ours, {"fc.weight": torch.zeros(2, 2)})["absent"] == ["midlayer.a"]
    logits = torch.tensor([[[0.0, 1.0], [2.0, 0.0]]])
    step = interop.compare_step({"out": torch.zeros(1, 2, 3), "logits": logits},
                                {"out": torch.full((1, 2, 3), 0.5), "logits": logits.flip(-1)})
    assert step["top1_equal"] == 0 and step["positions"] == 2 and step["out_max_diff"] == 0.5


def test_summary_names_skipped_and_checked_consumers():
    info = {"prompts": 4, "max_new_tokens": 48, "head": "h", "machine": {"cpu": "X", "cores": 2, "torch": "2"},
            "consumers": {"llama.cpp": {"status": "skipped", "error": "llama.cpp is not installed: no x"},
                          "vllm": {"status": "checked", "runs": {"eagle3:k1": {
                              "version": "0.32.0", "accepted_per_position": {"ours": [3], "theirs": [3]},
                              "rounds": {"ours": 10, "theirs": 10}, "acceptance_equal": True,
                              "greedy_equal_vanilla": 4, "prompts": 4, "ours_equal_vanilla": 4}}}}}
    md = interop.summary_markdown(info)
    assert "| llama.cpp | - | skipped |" in md and "llama.cpp is not installed" in md
    assert "[3] of 10 vs [3] of 10 (equal)" in md and "| 4/4 equal |" in md


# ============================================================================================ llama.cpp
def test_saved_eagle3_head_is_what_llamacpps_converter_detects(head3):
    """Its convert_hf_to_gguf.py takes a head as EAGLE-3 only with draft_vocab_size AND one layer, reads the
    tapped layers from the top-level key (our numbering) and renames midlayer.* itself."""
    cfg = json.loads((head3 / "config.json").read_text())
    assert "draft_vocab_size" in cfg and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_aux_hidden_state_layer_ids"] == cfg["eaglespec"]["feature_layer_ids"]
    assert "target_hidden_size" in cfg and not cfg.get("norm_before_residual") and not cfg.get("norm_before_fc")


def test_llamacpp_log_parsing_and_text_agreement():
    log = ("I decoded   49 tokens in    2.617 seconds, speed:   18.723 t/s\nI n_predict = 49\n"
           "I n_drafted = 38\nI n_accept  = 11\nI accept    = 28.947%\n")
    assert peers.parse_llamacpp_log(log) == {"drafted": 38, "accepted": 11, "predicted": 49, "decode_s": 2.617}
    with pytest.raises(peers.PeerError, match="no drafted count"):
        peers.parse_llamacpp_log("I decoded 3 tokens")
    assert interop._common_prefix("hello world", "hello there") == 6
    assert interop._common_prefix("same", "same") == 4 and interop._common_prefix("", "x") == 0


def test_llamacpp_timings_parsing():
    log = ("llama_perf_context_print:        load time =     120.10 ms\n"
           "llama_perf_context_print: prompt eval time =      35.50 ms /    20 tokens (    1.78 ms per token)\n"
           "llama_perf_context_print:        eval time =    1270.00 ms /   127 runs   (   10.00 ms per token)\n")
    got = peers.parse_llamacpp_timings(log)
    assert got == {"prompt_s": 0.0355, "prompt_tokens": 20, "eval_s": 1.27, "eval_tokens": 127}
    with pytest.raises(peers.PeerError, match="no generation timings"):
        peers.parse_llamacpp_timings("llama_perf_context_print: prompt eval time = 3.0 ms / 2 tokens")
