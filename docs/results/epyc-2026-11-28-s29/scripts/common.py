# What the session-29 scripts share: the default int4 target with a batch-1 cache holding `context` random tokens.
import torch

from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target


def target_with_context(context=256, room=16, seed=0):
    """(model, cache, generator): 2 threads, the cache's one row filled with `context` random tokens."""
    allocator.tune()
    torch.set_num_threads(2)
    m = load_target(None).model
    g = torch.Generator().manual_seed(seed)
    cache = m.new_cache(1, context + room)
    with torch.inference_mode():
        m(torch.randint(0, m.args.vocab_size, (1, context), generator=g), torch.arange(context)[None], cache,
          prefill=True)
    cache.lengths[:] = context
    return m, cache, g
