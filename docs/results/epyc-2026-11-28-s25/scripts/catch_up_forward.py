# What one catch-up forward of the shipped head costs by rows and pairs (``EagleProposer._encode`` on the draft
# cache, the median of 5 after a warm-up), for ``proposer.CATCH_UP_FORWARD_PAIRS``: a fixed part and a price a
# pair. Random features and tokens (the cost does not depend on them). Usage: catch_up_forward.py
import torch

from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
from eaglespec.runtime.quant import _median_time  # one warm-up call, the median of the rest
from eaglespec.spec.speculative import DraftOptions

allocator.tune()
torch.set_num_threads(2)
p = build_calibrated_proposer(load_target(None), DraftOptions())
p.reserve(4, 2048)
F = p.head.config.feature_size

with torch.inference_mode():
    for B, T in ((1, 16), (1, 64), (1, 250), (4, 16), (4, 32), (4, 64), (4, 250)):
        feats = torch.randn(B, T, F).to(p.head.dtype)
        toks = torch.randint(0, 1000, (B, T))
        rows = torch.arange(B)

        def encode():
            p.cache.lengths[rows] = 0
            p._encode(rows, feats, toks, torch.full((B,), T))

        ms = _median_time(encode, 5) * 1e3
        print(f"rows {B} pairs a row {T:4d}: {ms:6.2f} ms, {ms * 1e3 / (B * T):5.1f} us a pair")
