"""Consumer layouts of an EAGLE-3 head: the directories other engines and trainers load without conversion.

``heads.save_head`` writes the SpecForge/SGLang layout (``midlayer.*``, architectures
["LlamaForCausalLMEagle3"], top-level ``eagle_aux_hidden_state_layer_ids`` in vLLM's "input of layer k"
numbering, which equals ours). What each consumer reads, as checked by ``eaglespec interop``
(docs/INTEROP.md) and pinned by tests/test_interop.py:

* vLLM (``method="eagle3"``): the saved directory as is. It reads ``draft_vocab_size``,
  ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids`` and ``d2t`` (``t2d`` is skipped); it ignores
  ``torch_dtype`` (the draft runs in the target's dtype) and our ``eaglespec`` block. ``write_speculators``'s
  directory loads in vLLM too.
* speculators (``Eagle3DraftModel.from_pretrained``): only its native config (``speculators_model_type:
  eagle3``, a nested ``transformer_layer_config``, ``speculators_config``) with ``layers.0.*`` tensors; our
  layout is an "unrecognized external format" for it. Its loader tolerates a missing ``embed_tokens.weight``
  and then keeps a RANDOM embedding unless the verifier's weights are loaded afterwards, so
  ``write_speculators`` stores the target's embedding with the head (``load_head`` accepts it when it equals
  the target's).
* SpecForge (``AutoDraftModel`` / ``warm_start_draft_model``): the saved directory as is for the weights
  (the embedding is reloaded from the target, as SpecForge does for its own checkpoints). For continued
  training SpecForge resolves the target layers to capture from ``eagle_config.eagle_aux_hidden_state_layer_ids``
  in ITS numbering ("output of layer k" = ours - 1), else from its default (1, L//2 - 1, L - 4);
  ``write_specforge`` writes that key so the capture does not depend on the default matching.
* llama.cpp (``convert_hf_to_gguf.py --target-model-dir``): the saved directory as is; see
  docs/INTEROP.md for the converter's own needs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from eaglespec.spec.heads import CONFIG_FILE, WEIGHTS_FILE, feature_ids_to_hf

__all__ = ["LayoutError", "read_eagle3_head", "speculators_config", "write_specforge", "write_speculators"]

SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
# the decoder-layer keys speculators' transformer_layer_config needs (a LlamaConfig)
_LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "num_hidden_layers", "hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling",
               "max_position_embeddings", "vocab_size", "attention_bias", "mlp_bias", "tie_word_embeddings")


class LayoutError(ValueError):
    """A head directory that cannot be exported in a consumer layout (the message names the reason)."""


def read_eagle3_head(head_dir: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(config, tensors) of a head written by ``save_head`` (SpecForge layout); refuses anything else."""
    from safetensors.torch import load_file

    head_dir = Path(head_dir)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (head_dir / name).is_file():
            raise LayoutError(f"{head_dir}: no {name} (give a head directory written by eaglespec train)")
    cfg = json.loads((head_dir / CONFIG_FILE).read_text())
    kind = (cfg.get("eaglespec") or {}).get("kind")
    if kind != "eagle3":
        raise LayoutError(f"{head_dir}: only EAGLE-3 heads have consumer layouts (eaglespec.kind is {kind!r})")
    tensors = load_file(str(head_dir / WEIGHTS_FILE))
    if not any(n.startswith("midlayer.") for n in tensors):
        raise LayoutError(f"{head_dir}: no midlayer.* tensors: not the layout save_head writes")
    return cfg, tensors


def _layer_ids(cfg: Mapping[str, Any]) -> list[int]:
    meta = cfg["eaglespec"]
    return list(feature_ids_to_hf(meta["feature_layer_ids"], meta.get("feature_layer_convention",
                                                                      "hf_hidden_states_index")))


def speculators_config(cfg: Mapping[str, Any], verifier: str, verifier_architectures: list[str],
                       speculative_tokens: int = 3) -> dict[str, Any]:
    """speculators' native Eagle3SpeculatorConfig for a head whose engine config is ``cfg``.

    ``verifier`` (a hub id or local path of the target) becomes the verifier's ``name_or_path``: speculators
    0.9.0 reads the verifier's config on every load (``Eagle3DraftModel.load_verifier_weights`` passes a
    null name_or_path on to ``AutoConfig.from_pretrained``, which then fails), and checks the written layer
    ids against its depth.
    """
    if not verifier:
        raise LayoutError("speculators needs the verifier (the target's hub id or local path) in its config")
    layer = {k: cfg[k] for k in _LAYER_KEYS if k in cfg} | {"model_type": "llama",
                                                           "architectures": ["LlamaForCausalLM"]}
    return {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg["draft_vocab_size"],
        "target_hidden_size": cfg.get("target_hidden_size") or cfg["hidden_size"],
        "eagle_aux_hidden_state_layer_ids": _layer_ids(cfg),  # speculators and vLLM: "input of layer k" = ours
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "torch_dtype": cfg.get("torch_dtype", "float32"),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
    }


def write_speculators(head_dir: str | Path, out_dir: str | Path, embed_weight: Tensor, verifier: str,
                      verifier_architectures: list[str], speculative_tokens: int = 3) -> Path:
    """Export a saved EAGLE-3 head in speculators' native layout: ``layers.0.*`` tensors, its config, and
    the target's embedding table (``embed_weight`` [V, H]; see the module docstring for why)."""
    from safetensors.torch import save_file

    cfg, tensors = read_eagle3_head(head_dir)
    if tuple(embed_weight.shape) != (cfg["vocab_size"], cfg["hidden_size"]):
        raise LayoutError(f"embedding table {tuple(embed_weight.shape)} does not fit the head "
                          f"(vocab_size {cfg['vocab_size']}, hidden_size {cfg['hidden_size']})")
    out = {("layers.0." + n[len("midlayer."):] if n.startswith("midlayer.") else n): t for n, t in tensors.items()}
    # kept in the target's own dtype: a bfloat16 copy of a float32 table would not be the target's table
    out["embed_tokens.weight"] = embed_weight.detach().to("cpu").contiguous()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config = speculators_config(cfg, verifier, verifier_architectures, speculative_tokens)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def write_specforge(head_dir: str | Path, out_dir: str | Path) -> Path:
    """Export a saved EAGLE-3 head for SpecForge: the same tensors and config plus
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SpecForge's "output of layer k" numbering."""
    cfg, _ = read_eagle3_head(head_dir)
    ids = _layer_ids(cfg)
    if len(ids) != 3 or min(ids) < 1:
        raise LayoutError(f"SpecForge fuses exactly three target layers, each the output of a layer; "
                          f"this head reads {ids} (HF hidden_states indices)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(head_dir) / WEIGHTS_FILE, out_dir / WEIGHTS_FILE)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids]}
    (out_dir / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    return out_dir

