# fine-grained perf_counter timers of an engine decoding 8 MT-bench first turns (outside the matrix) at batch 1. Usage: parts2.py chain1|vanilla
import sys, time, torch, collections
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s15" / "scripts"))  # timers.py
from common import mt_bench_requests, proposer
from timers import acc, cnt, wrap
from eaglespec.runtime.loading import load_target
from eaglespec.engine.generate import Engine
import eaglespec.engine.generate as G, eaglespec.runtime.model as M, eaglespec.spec.heads as H, eaglespec.spec.proposer as PR
import eaglespec.spec.verify as V, eaglespec.runtime.logits as L, eaglespec.spec.strategies as S
from eaglespec.runtime.quant import PackedLinear
torch.set_num_threads(2)
t = load_target()
reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=0.0)
kind = sys.argv[1]
p = proposer(t, kind)
e = Engine(t, p, max_batch_size=1)
fwd = t.model.forward
def tf(tokens, *a, **k):
    t0 = time.perf_counter(); r = fwd(tokens, *a, **k)
    if not k.get("prefill"): acc["target.fwd"] += time.perf_counter() - t0; cnt["target.fwd"] += 1
    return r
t.model.forward = tf
wrap(e, "_step", "step"); wrap(e, "_verify", "e.verify"); wrap(e, "_commit_tokens", "e.commit_tokens")
for mod in (M, H):
    wrap(mod, "plan_attention", f"{mod.__name__.split('.')[-1]}.plan_attention")
wrap(M.Rotary, "forward", "rotary")
wrap(G, "tree_positions", "tree_positions")
wrap(V, "argmax", "verify.argmax")
wrap(M, "rescored_logits", "rescored_logits") if hasattr(M, "rescored_logits") else None
wrap(t.model, "output_logits", "output_logits") if hasattr(t.model, "output_logits") else None
if p is not None:
    for n in ["propose", "commit", "children", "root_features", "_commit_chain", "_append_pairs"]: wrap(p, n, "p." + n)
    for n in ["forward", "fuse", "logits", "to_target_ids"]: wrap(p.head, n, "head." + n)
    wrap(p.dispatcher, "pick", "pick")
    for c in p.dispatcher.configs if hasattr(p.dispatcher, "configs") else []:
        def timed_draft(*a, _f=c.draft, **k):
            t0 = time.perf_counter(); r = _f(*a, **k); acc["cfg.draft"] += time.perf_counter() - t0; cnt["cfg.draft"] += 1
            return r
        object.__setattr__(c, "draft", timed_draft)
    wrap(H, "LayerStepCall", "head.LayerStepCall.init")
    wrap(PR, "argmax", "children.argmax")
with torch.inference_mode():
    e.generate(reqs[:1]); wrap(e.cache, "advance", "tcache.advance"); acc.clear(); cnt.clear()
    for r in reqs: e.generate([r])
steps = cnt["step"]
for k in sorted(acc, key=lambda k: -acc[k]): print(f"{k:26s} {cnt[k]/steps:5.2f}/step {acc[k]/steps*1e3:7.3f} ms/step {acc[k]/max(cnt[k],1)*1e6:7.1f} us/call")
