"""How close are the features a head is trained on to the ones it sees at inference, per capture precision?

Captures the same prepared records with the target in float32, bfloat16 and the default decoding precision
(`--dtype auto`: a Q4_1 GGUF's packed int4) and prints, per precision, one JSON line against the default one:
mean cosine and relative error of the final hidden state and of the EAGLE-3 tapped layers over the loss tokens,
and the target's top-1 agreement. Usage:

    python scripts/feature_agreement.py PREPARED_DATA_DIR [--records 6] [--model M] [--threads 1]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from eaglespec.runtime.loading import auto_precision, load_target, resolve_model
from eaglespec.spec.heads import default_feature_layer_ids
from eaglespec.train.data import read_prepared
from eaglespec.train.features import capture_batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="a prepare-data output directory")
    p.add_argument("--records", type=int, default=6)
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    records, _ = read_prepared(a.data)
    if not records:
        raise SystemExit(f"{a.data}: no records")
    records = records[: a.records]
    default = auto_precision(resolve_model(a.model), "cpu")
    batches = {}
    for dtype in dict.fromkeys(("float32", "bfloat16", default)):
        model = load_target(a.model, dtype=dtype).model
        layers = default_feature_layer_ids(model.args.num_hidden_layers)
        with torch.no_grad():
            batches[dtype] = capture_batch(model, records, layers)
        del model
    ref = batches[default]
    mask = ref.loss_mask
    for dtype, fb in batches.items():
        if dtype == default:
            continue
        row = {"precision": dtype, "against": default, "records": len(records), "tokens": int(mask.sum())}
        for name in ("hidden", "aux"):
            x, y = getattr(fb, name)[mask].float(), getattr(ref, name)[mask].float()
            if name == "aux":  # one row per tapped layer
                x, y = x.reshape(-1, len(layers), x.shape[-1] // len(layers)), y.reshape(x.shape[0], len(layers), -1)
            row[f"{name}_cosine"] = round(float(F.cosine_similarity(x, y, dim=-1).mean()), 5)
            row[f"{name}_rel_error"] = round(float((x - y).norm() / y.norm()), 5)
        row["top1_agreement"] = round(float((fb.top1[mask] == ref.top1[mask]).float().mean()), 4)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
