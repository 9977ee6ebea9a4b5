# per request: auto vs chain1 vs chain2 vs vanilla, decode seconds, auto's rounds, chain1's depth-1 acceptance
import sys, torch, json
from eaglespec.measure.ab import arm_engine, first_turn_requests
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"))
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
names = sys.argv[5:]
arms = {n: arm_engine(target, n, 1) for n in names}
passes = int(sys.argv[4])
rec = {n: [[0.0, None, None] for _ in reqs] for n in names}
with torch.inference_mode():
    for n in names: arms[n].generate(reqs[:1])  # warm-up
    for p in range(passes):
        for i, r in enumerate(reqs):
            k = (p * 7 + i) % len(names)
            for n in names[k:] + names[:k]:
                c = arms[n].generate([r])[0]
                rec[n][i][0] += c.stats.draft_s + c.stats.verify_s
                rec[n][i][1] = dict(c.stats.tree_rounds or {})
                rec[n][i][2] = c.stats.acceptance_by_position(2)
tot = {n: sum(x[0] for x in rec[n]) for n in names}
print({n: round(tot["vanilla"] / tot[n], 3) for n in names})
for i in range(len(reqs)):
    v = rec["vanilla"][i][0]
    print(i, len(reqs[i].prompt_ids), " ".join(f"{n}:{v / rec[n][i][0]:.2f}" for n in names if n != "vanilla"),
          "| c1 acc", [round(a, 2) for a in rec["chain1"][i][2]][:1] if "chain1" in rec else "",
          "c2 acc", [round(a, 2) for a in rec["chain2"][i][2]] if "chain2" in rec else "",
          "| auto", rec["auto"][i][1])
