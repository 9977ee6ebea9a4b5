"""Greedy answers to three short questions in the given precisions (e.g. float32 int4). Run from the repository root:
python docs/results/session6-2026-11-26/paris.py float32 int4"""
import torch, sys
from eaglespec.runtime.loading import load_target
from eaglespec.cli import encode_prompt
from eaglespec.engine.generate import Engine, Request
from eaglespec.config import GenerationConfig
torch.set_num_threads(2)
for dt in sys.argv[1:]:
    target = load_target(None, dt)
    with torch.inference_mode():
        for q in ("What is the capital of France?", "Name three primary colors.", "What is 12 times 12?"):
            p = encode_prompt(target.tokenizer, q, chat=True)
            out = Engine(target).generate([Request(p, GenerationConfig(24))])[0]
            print(dt, repr(out.text[:80]))
