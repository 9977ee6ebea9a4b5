# What feedback_trace.py and paused_split.py share: the default target on 2 threads, the first turns of a dataset
# file as chat prompts, and the default `--tree auto` proposer on this machine's calibration.
import torch

from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions


def setup(path: str, per_category: int, tune_allocator: bool = True):
    """(target, prompt token ids, proposer); ``tune_allocator``: as every eaglespec command does (feedback_trace.py's
    recorded run did not)."""
    if tune_allocator:
        allocator.tune()
    torch.set_num_threads(2)
    t = load_target(None)
    prompts = [encode_messages(t.tokenizer, [{"role": "user", "content": q.turns[0]}])
               for q in load_questions(path, per_category=per_category)]
    return t, prompts, build_calibrated_proposer(t, DraftOptions())
