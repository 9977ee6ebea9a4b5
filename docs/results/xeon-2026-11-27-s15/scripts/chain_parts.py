# Where a decode step's time goes, vanilla or a chain of 1 (8 MT-bench first turns outside the matrix, greedy, b1):
# perf_counter wrappers around the engine's and the proposer's parts. Usage: chain_parts.py vanilla|chain1
import sys, time, collections, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
from eaglespec.spec.speculative import DraftOptions, build_proposer
import eaglespec.engine.generate as G
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=0.0)
p = build_proposer(t, DraftOptions(tree="chain", depth=1)) if sys.argv[-1] != "vanilla" else None
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from timers import acc, cnt, wrap
if p is not None:
    wrap(p, "propose", "propose"); wrap(p, "commit", "commit")
    wrap(p.head, "forward", "head.forward"); wrap(p.head, "fuse", "head.fuse"); wrap(p.head, "logits", "head.logits")
_f = t.model.forward
def fw(tokens, *a, **k):
    t0 = time.perf_counter(); r = _f(tokens, *a, **k); dt = time.perf_counter() - t0
    if not k.get("prefill"):
        acc["target.forward(decode)"] += dt; cnt["target.forward(decode)"] += 1
    return r
t.model.forward = fw
e = Engine(t, p, max_batch_size=1)
wrap(e, "_verify", "verify"); wrap(e, "_step", "step")
with torch.inference_mode():
    e.generate(reqs[:1]); acc.clear(); cnt.clear()
    for r in reqs: e.generate([r])
steps = cnt["step"]
for k in acc: print(f"{k:15s} {cnt[k]:5d} calls {acc[k]/steps*1e3:7.3f} ms/step")
