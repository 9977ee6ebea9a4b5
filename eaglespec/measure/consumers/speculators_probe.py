"""speculators probe: load an exported head with speculators' own loader and run one parallel draft step.

Usage (inside the speculators venv): python speculators_probe.py REQUEST.json RESULT.json

REQUEST: {"head_dir": speculators-layout directory, "inputs": safetensors with "features" [1, T, 3H] float32,
          "tokens" int64 [1, T], "positions" int64 [1, T]; "outputs": safetensors path to write}
RESULT:  {"speculators_version", "class", "config" (what the loaded config says)}
OUTPUTS: every tensor of the loaded model's state_dict under "state.NAME", and "out" [1, T, H] (the
         decoder output before the final norm) and "logits" [1, T, draft_V] of the draft step.

The step is run through the model's own modules (fc, embed_tokens, rotary_emb, layers, norm, lm_head) with
an explicit causal mask, as the first step of speculators' training-time test does, without its loss.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version


def main(request_path: str, result_path: str) -> int:

    import torch
    from safetensors.torch import load_file, save_file
    from speculators.models.eagle3 import Eagle3DraftModel

    req = json.loads(open(request_path).read())
    # (its from_pretrained override does not pass output_loading_info through: the tensors are compared instead)
    # float32 as ours: with the config's torch_dtype (bfloat16) the shared embedding would be rounded too
    model = Eagle3DraftModel.from_pretrained(req["head_dir"], dtype=torch.float32).eval()
    tl = model.config.transformer_layer_config
    tl._attn_implementation = "eager"  # the explicit float mask below; flex attention needs a compiler
    inputs = load_file(req["inputs"])
    feats, tokens, positions = inputs["features"], inputs["tokens"], inputs["positions"]
    n = tokens.shape[1]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]  # [1, 1, T, T] causal
    with torch.no_grad():
        h = torch.cat([model.embed_tokens(tokens), model.fc(feats)], dim=-1)  # [1, T, 2H]
        rope = model.rotary_emb(h, positions)
        for layer in model.layers:
            h = layer(h, attention_mask=mask, position_ids=positions, position_embeddings=rope)
        logits = model.lm_head(model.norm(h))
    state = {f"state.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state | {"out": h.contiguous(), "logits": logits.contiguous()}, req["outputs"])
    result = {
        "speculators_version": version("speculators"),
        "class": type(model).__name__,
        "config": {"eagle_aux_hidden_state_layer_ids": model.config.eagle_aux_hidden_state_layer_ids,
                   "draft_vocab_size": model.config.draft_vocab_size,
                   "num_hidden_layers": tl.num_hidden_layers, "norm_before_residual": model.config.norm_before_residual},
    }
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
