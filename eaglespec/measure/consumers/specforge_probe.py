"""SpecForge probe: load an exported head the way SpecForge warm-starts training and run one draft step.

Usage (inside the SpecForge venv): python specforge_probe.py REQUEST.json RESULT.json

REQUEST: {"head_dir", "target_dir" (HF directory of the target: the embedding is reloaded from it, as
          SpecForge does), "inputs"/"outputs" as in speculators_probe.py, "save_dir" (optional: where
          the loaded model is saved again with save_pretrained, for the round trip into eaglespec)}
RESULT:  {"specforge_version", "class", "capture_layers" (the target layers SpecForge would capture for
          continued training, its "output of layer k" numbering), "warm_start" (its report)}
OUTPUTS: "state.NAME" for the loaded state_dict, "out" [1, T, H] (before the final norm), "logits".
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from types import SimpleNamespace


def main(request_path: str, result_path: str) -> int:
    import torch
    from safetensors.torch import load_file, save_file
    from specforge.algorithms.model_providers import resolve_eagle_capture_layers
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig
    from specforge.training.model_loading import warm_start_draft_model
    from transformers import AutoConfig

    req = json.loads(open(request_path).read())
    config = AutoDraftModelConfig.from_file(f"{req['head_dir']}/config.json")
    model = AutoDraftModel.from_config(config).to(torch.float32)
    model.load_embedding(req["target_dir"], embedding_key="model.embed_tokens.weight")
    report = warm_start_draft_model(model, req["head_dir"], draft_config=config, strategy="eagle3",
                                    allow_missing_embedding=True)
    model.eval()
    run_cfg = SimpleNamespace(model=SimpleNamespace(aux_hidden_state_layer_ids=None))
    draft_cfg = json.loads(open(f"{req['head_dir']}/config.json").read())
    layers = resolve_eagle_capture_layers(run_cfg, draft_cfg, AutoConfig.from_pretrained(req["target_dir"]))

    inputs = load_file(req["inputs"])
    feats, tokens, positions = inputs["features"], inputs["tokens"], inputs["positions"]
    n = tokens.shape[1]
    mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]  # [1, 1, T, T] causal
    with torch.no_grad():
        h = model.backbone(model.embed_input_ids(tokens), model.project_hidden_states(feats), None, mask,
                           positions, use_cache=False)
        logits = model.compute_logits(h)
    state = {f"state.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state | {"out": h.contiguous(), "logits": logits.contiguous()}, req["outputs"])
    if req.get("save_dir"):
        model.save_pretrained(req["save_dir"])
    result = {"specforge_version": version("specforge"), "class": type(model).__name__,
              "capture_layers": list(layers),
              "warm_start": {"format": report.checkpoint_format, "loaded_keys": report.loaded_keys,
                             "missing_keys": list(report.missing_keys)}}
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
