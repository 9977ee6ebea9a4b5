# per request: auto vs chain1 vs chain2 vs vanilla, decode seconds, auto's rounds, chain1's depth-1 acceptance
import torch

from arms import from_argv
reqs, passes, arms = from_argv()
names = list(arms)
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
