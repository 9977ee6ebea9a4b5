"""Vanilla decoding speed: eaglespec's runtime vs HF transformers `generate()` on the same model.

Protocol (written once, followed by every arm):
- same model weights (the default model's dequantized GGUF unless --model), same precision, same prompts
  (the first --n-prompts MT-bench first turns through the chat template), greedy;
- every arm generates exactly --max-new-tokens tokens per prompt (EOS ignored / min_new_tokens), so token
  counts are identical;
- one unreported warm-up generation per arm before timing;
- wall time per batch of prompts around prefill + decode; tokens/s = generated tokens / wall seconds;
- one JSON record per (arm, dtype, batch size) appended to --out, with the machine facts.

Usage: python bench/vanilla.py --dtypes float32,bfloat16 --batch-sizes 1,4 --out results/vanilla.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from eaglespec.cli import encode_prompt, read_prompts_file
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.generate import Engine, Request
from eaglespec.loading import load_target

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench" / "question.jsonl"


def machine_facts(device: str) -> dict:
    facts = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    if device.startswith("cuda"):
        facts["gpu"] = torch.cuda.get_device_name(device)
    return facts


def run_eaglespec(target, prompts: list[list[int]], max_new: int, batch: int) -> tuple[float, int]:
    cfg = GenerationConfig(max_new, SamplingParams(), (), ignore_eos=True)
    engine = Engine(target, max_batch_size=batch)
    engine.generate([Request(prompts[0], GenerationConfig(8, SamplingParams(), (), True))] * batch)  # warm-up
    t0 = time.perf_counter()
    outs = engine.generate([Request(p, cfg) for p in prompts])
    wall = time.perf_counter() - t0
    return wall, sum(len(o.token_ids) for o in outs)


def run_hf(hf_model, tokenizer, prompts: list[list[int]], max_new: int, batch: int, device) -> tuple[float, int]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def gen(group: list[list[int]], n: int) -> int:
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=device)  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=device)
        out = hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=pad)
        return (out.shape[1] - width) * len(group)

    gen(prompts[:batch], 8)  # warm-up
    t0 = time.perf_counter()
    tokens = sum(gen(prompts[i : i + batch], max_new) for i in range(0, len(prompts), batch))
    return time.perf_counter() - t0, tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts-file", default=str(DEFAULT_PROMPTS))
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--arms", default="eaglespec,hf")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="results/vanilla.jsonl")
    args = ap.parse_args()

    prompts_text = read_prompts_file(args.prompts_file)[: args.n_prompts]
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    facts = machine_facts(args.device)
    for dtype in args.dtypes.split(","):
        target = load_target(args.model, dtype=dtype, device=args.device)
        prompts = [encode_prompt(target.tokenizer, p, chat=True) for p in prompts_text]
        hf_model = None
        if "hf" in args.arms.split(","):
            from transformers import AutoModelForCausalLM

            hf_model = AutoModelForCausalLM.from_config(target.hf_config, dtype=target.model.dtype)
            missing, unexpected = hf_model.load_state_dict(target.state_dict, strict=False)
            if unexpected or [m for m in missing if m != "lm_head.weight"]:
                raise RuntimeError(f"HF model weights do not match: missing {missing}, unexpected {unexpected}")
            hf_model.tie_weights()
            hf_model.to(args.device).eval()
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            for arm in args.arms.split(","):
                with torch.inference_mode():
                    if arm == "eaglespec":
                        wall, tokens = run_eaglespec(target, prompts, args.max_new_tokens, batch)
                    elif arm == "hf":
                        wall, tokens = run_hf(hf_model, target.tokenizer, prompts, args.max_new_tokens, batch,
                                              args.device)
                    else:
                        raise SystemExit(f"unknown arm {arm!r} (eaglespec, hf)")
                rec = {"arm": arm, "model": target.name, "dtype": dtype, "device": args.device,
                       "batch_size": batch, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                       "new_tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
                       **facts}
                print(json.dumps(rec), flush=True)
                with out_path.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
