# What this session's comparison scripts share: a script's arguments QUESTIONS PER_CATEGORY TEMPERATURE PASSES ARM...
# -> the default target (2 threads, the allocator tuned), the first-turn requests and one engine per arm at batch 1
# (eaglespec.measure.ab). Imported from the scripts beside it.
import sys

import torch

from eaglespec.measure.ab import arm_engine, first_turn_requests
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target


def from_argv():
    """(requests, passes, {arm name: engine}) from sys.argv, the CPU printed first."""
    allocator.tune(); torch.set_num_threads(2)
    print("cpu:", cpu_kernels.cpuinfo("model name"))
    target = load_target(None)
    reqs = first_turn_requests(target.tokenizer, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
    return reqs, int(sys.argv[4]), {n: arm_engine(target, n, 1) for n in sys.argv[5:]}
