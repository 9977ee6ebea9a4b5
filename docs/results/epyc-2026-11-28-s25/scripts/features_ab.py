# Does returning the head's three layers' features make the target's decode forward slower? The same batch-4
# 1-token forward (logits at every position, 256 tokens of context a row, the same cache slots rewritten each
# call) with and without ``hidden_indices``, in alternating pairs (the order flipped every pair); medians and the
# mean paired difference. Usage: features_ab.py [PAIRS]
import statistics, sys, time

import torch

from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.runtime import allocator
from eaglespec.runtime.kvcache import HostRows
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions

allocator.tune()
torch.set_num_threads(2)
target = load_target(None)
model = target.model
indices = build_calibrated_proposer(target, DraftOptions()).hidden_indices
pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 400
B, P = 4, 256
cache = model.new_cache(B, P + 8)
rows = torch.arange(B)
gen = torch.Generator().manual_seed(0)
with torch.inference_mode():
    prompt = torch.randint(0, 49152, (B, P), generator=gen)
    model(prompt, torch.arange(P).expand(B, P), cache, rows=rows, prefill=True)
    cache.advance(rows, torch.full((B,), P))
    tokens = torch.randint(0, 49152, (B, 1), generator=gen)
    positions = torch.full((B, 1), P)
    host = HostRows(tuple(range(B)), (P,) * B, P)

    def forward(hidden):
        t0 = time.perf_counter()
        model(tokens, positions, cache, rows=rows, logits_at="all", hidden_indices=hidden, host=host)
        return time.perf_counter() - t0

    for _ in range(20):
        forward(indices), forward(())
    plain, feats = [], []
    for i in range(pairs):
        if i % 2:
            feats.append(forward(indices)), plain.append(forward(()))
        else:
            plain.append(forward(())), feats.append(forward(indices))
diffs = [f - p for f, p in zip(feats, plain)]
print(f"hidden_indices {indices}, batch {B}, context {P}, {pairs} pairs")
print(f"median: without {statistics.median(plain) * 1e3:.3f} ms, with {statistics.median(feats) * 1e3:.3f} ms")
print(f"paired difference (with - without): mean {statistics.mean(diffs) * 1e6:+.1f} us, "
      f"median {statistics.median(diffs) * 1e6:+.1f} us, ratio of medians {statistics.median(feats) / statistics.median(plain):.4f}")
