# What aux_keep.py and aux_prof.py share: the default int4 target, 2 threads, a batch-4 cache holding 300 random
# tokens a row, and the arguments of one decode forward over it.
import torch

from eaglespec.runtime import allocator
from eaglespec.runtime.kvcache import HostRows
from eaglespec.runtime.loading import load_target


def batch4_decode(ctx=300, batch=4):
    """(target, forward): forward(hidden_indices) runs one decode token a row over the filled cache."""
    allocator.tune()
    torch.set_num_threads(2)
    t = load_target(None)
    m = t.model
    g = torch.Generator().manual_seed(0)
    cache = m.new_cache(batch, 8192)
    with torch.inference_mode():
        m(torch.randint(0, 1000, (batch, ctx), generator=g), torch.arange(ctx).expand(batch, ctx), cache, prefill=True)
    cache.lengths[:] = ctx
    rows, tok, pos = torch.arange(batch), torch.full((batch, 1), 5), torch.full((batch, 1), ctx)
    host = HostRows(tuple(range(batch)), (ctx,) * batch, ctx)
    return t, lambda h: m(tok, pos, cache, rows=rows, logits_at="all", hidden_indices=h, host=host)
