"""Time the int4 kernels and the attention kernels on the default model's shapes, one JSONL record per point.

Protocol: SmolLM2-135M's 30 decoder layers' projections (fused q/k/v 960x576, o 576x576, fused gate/up
3072x576, down 576x1536) and its lm_head (49152x576) with random int4 weights, and its attention (9 query
heads over 3 KV heads of 64, a 256-token prefix plus the new tokens, causal among them); for each row count,
3 warm-up calls, then the median of --reps timed calls of the whole set. Weights are not cache-resident
between layers (the set is ~60 MB), as in a decode step. Record the CPU with the numbers (in the records).

    python scripts/bench_kernels.py --threads 2 --out OUT.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from eaglespec.runtime import cpu_kernels, w4a8
from eaglespec.runtime.model import attention
from eaglespec.runtime.quant import machine_fingerprint

LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LM_HEAD = (49152, 576)


def _median_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _int4(n: int, k: int, g: torch.Generator):
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32)
    scale = torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3
    offset = -8 * scale
    torch_w = (torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1),
               torch.stack([scale, offset + 8 * scale], -1).to(torch.bfloat16).transpose(0, 1).contiguous())
    return k, torch_w, w4a8.pack(q, scale, offset)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_kernels.available():
        raise SystemExit(f"our CPU kernels do not run here: {cpu_kernels.unavailable_reason()}")
    g = torch.Generator().manual_seed(0)
    layers = [_int4(n, k, g) for _ in range(30) for n, k in LAYER_SHAPES]
    head = _int4(*LM_HEAD, g)
    machine = machine_fingerprint(args.threads)
    with open(args.out, "w") as out:
        for rows in (int(r) for r in args.rows.split(",")):
            xs = {k: torch.randn(rows, k, generator=g) for k in (576, 1536)}

            def torch_int4(ws):  # as PackedLinear runs it: bfloat16 activations, float32 out
                for k, (packed, sz), _ in ws:
                    torch.ops.aten._weight_int4pack_mm_for_cpu(xs[k].to(torch.bfloat16), packed, 32, sz).float()

            def ours(ws):
                for k, _, (wq, sc, off) in ws:
                    w4a8.mm(xs[k], wq, sc, off)

            s = 256 + rows
            qa = torch.randn(1, rows, 9, 64, generator=g)
            ka, va = torch.randn(1, 3, s, 64, generator=g), torch.randn(1, 3, s, 64, generator=g)
            mask = torch.ones(1, 1, rows, s, dtype=torch.bool)
            mask[..., 256:] = torch.ones(rows, rows, dtype=torch.bool).tril()
            points = {
                "layers_int4_torch": lambda: torch_int4(layers),
                "layers_int4_w4a8": lambda: ours(layers),
                "lm_head_int4_torch": lambda: torch_int4([head]),
                "lm_head_int4_w4a8": lambda: ours([head]),
                "attention_x30_float64": lambda: [attention(qa, ka, va, mask, compute_dtype=torch.float64)
                                                  for _ in range(30)],
                "attention_x30_row_kernel": lambda: [attention(qa, ka, va, mask, exact_rows=True) for _ in range(30)],
            }
            for name, fn in points.items():
                rec = {"kernel": name, "rows": rows, "ms": round(_median_ms(fn, args.reps), 3),
                       "threads": args.threads, "machine": machine}
                out.write(json.dumps(rec) + "\n")
                print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
