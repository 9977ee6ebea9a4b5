# Chain of 1 vs plain on real prompts (Alpaca training subset, first turns), batch B, T=0, alternating per group
# in one process: per-forward wall (less prefill) ratio, and the chain's tokens per round. Then the calibration's
# synthetic prompt (tokens 5..20, 20 steps) paired, for comparison.
import json, statistics, sys, time, torch
from eaglespec.config import GenerationConfig
from eaglespec.datasets import encode_messages
from eaglespec.engine import calibrate as C
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.spec.strategies import Chain
from eaglespec.spec.proposer import EagleProposer
allocator.tune(); torch.set_num_threads(2)
B, N, DEPTH = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1
print("cpu:", cpu_kernels.cpuinfo("model name"), "batch", B, "depth", DEPTH)
t = load_target()
head = build_proposer(t, DraftOptions(tree="chain", depth=1)).head
data = json.load(open(sys.argv[1]))[:N]
reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": (d["instruction"] + "\n" + d.get("input", "")).strip()}]),
                GenerationConfig(128, ignore_eos=True)) for d in data]
groups = [reqs[i:i + B] for i in range(0, len(reqs), B)]
engs = {"plain": Engine(t, None, max_batch_size=B), "chain": Engine(t, EagleProposer(head, Chain(DEPTH)), max_batch_size=B)}
acc = {k: [0.0, 0, 0] for k in engs}
with torch.inference_mode():
    for e in engs.values(): e.generate(groups[0])
    for i, g in enumerate(groups):
        for k, e in (list(engs.items()) if i % 2 == 0 else list(engs.items())[::-1]):
            a = time.perf_counter(); out = e.generate(g); w = time.perf_counter() - a
            s = out[0].stats
            acc[k][0] += w - s.prefill_s; acc[k][1] += s.target_forwards; acc[k][2] += sum(len(o.token_ids) for o in out)
    per = {k: v[0] / v[1] for k, v in acc.items()}
    print("real prompts: per round plain %.2f chain %.2f ms, ratio %.3f; tokens/round/row chain %.3f; speedup %.3f" % (
        per["plain"] * 1e3, per["chain"] * 1e3, per["chain"] / per["plain"], acc["chain"][2] / acc["chain"][1] / B,
        acc["plain"][0] / acc["chain"][0]))
    for rep in range(2):
        tr, pl, st = C._paired_steps(t, EagleProposer(head, Chain(DEPTH)), B, 20, list(range(5, 21)))
        print(f"calibration's prompt: median ratio {statistics.median(a / b for a, b in zip(tr, pl)):.3f}; tokens/round "
              f"{st.accepted / max(st.target_forwards, 1) + 1 if hasattr(st, 'accepted') else float('nan'):.3f}")
