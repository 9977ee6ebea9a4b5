# Where a chain-of-1 (or vanilla) step's time goes, part by part: perf_counter wrappers (timers.py), 6 MT-bench first
# turns, greedy, batch 1. Usage: parts.py chain1|vanilla
import sys, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s15" / "scripts"))  # timers.py
from common import mt_bench_requests
from timers import acc, cnt, wrap
from steps import time_decode_forwards
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.spec.speculative import DraftOptions, build_proposer
import eaglespec.engine.generate as G
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 6, first=3, temperature=0.0)
p = build_proposer(t, DraftOptions(tree="chain", depth=1)) if sys.argv[-1] != "vanilla" else None
if p is not None:
    for n in ["propose", "commit", "children", "root_features"]: wrap(p, n, "p." + n)
    for n in ["forward", "fuse", "logits", "to_target_ids"]: wrap(p.head, n, "head." + n)
    wrap(p.dispatcher, "pick", "pick")
    for c in p.dispatcher.configs:  # strategies are frozen dataclasses: time their draft() through a plain function
        def timed_draft(*a, _f=c.draft, **k):
            t0 = time.perf_counter(); r = _f(*a, **k); acc["cfg.draft"] += time.perf_counter() - t0; cnt["cfg.draft"] += 1
            return r
        object.__setattr__(c, "draft", timed_draft)
time_decode_forwards(t.model)
e = Engine(t, p, max_batch_size=1)
wrap(e, "_verify", "verify"); wrap(e, "_step", "step"); wrap(e, "_commit_tokens", "commit_tokens")

for mod, n in [(G, "tree_positions"), (G, "tree_mask")]: wrap(mod, n, n)
with torch.inference_mode():
    e.generate(reqs[:1]); wrap(e.cache, "compact", "tcache.compact"); wrap(e.cache, "advance", "tcache.advance"); acc.clear(); cnt.clear()
    for r in reqs: e.generate([r])
steps = cnt["step"]
for k in sorted(acc, key=lambda k: -acc[k]): print(f"{k:18s} {cnt[k]:5d} calls {acc[k]/steps*1e3:7.3f} ms/step {acc[k]/max(cnt[k],1)*1e6:7.1f} us/call")
