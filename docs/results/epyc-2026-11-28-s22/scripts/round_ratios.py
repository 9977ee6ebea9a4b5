# Per matrix run: each arm's wall (less prefill) per verification round over vanilla's, per dataset, T and batch.
import json, collections, sys
for run in sys.argv[1:]:
    for ds in ("mt_bench", "spec_bench", "humaneval"):
        recs = [json.loads(l) for l in open(f"{run}/{ds}/records.jsonl")]
        acc, seen = collections.defaultdict(lambda: [0.0, 0]), set()
        for r in recs:
            key = (r["method"], r["temperature"], r["batch_size"], r["batch_wall_s"], r["prefill_s"])
            if key in seen: continue
            seen.add(key)
            grp = [x for x in recs if (x["method"], x["temperature"], x["batch_size"], x["batch_wall_s"]) == key[:4]]
            a = acc[key[:3]]; a[0] += r["batch_wall_s"] - r["prefill_s"]; a[1] += max(x["target_forwards"] for x in grp)
        out = {k: v[0] / v[1] * 1e3 for k, v in acc.items()}
        for T in (0.0, 1.0):
            for B in (1, 4):
                base = out[("vanilla", T, B)]
                print(run.split("/")[-1], ds, f"T={T:g} b{B}", " ".join(f"{m.split(':')[-1]} {out[(m, t, b)] / base:.3f}" for (m, t, b) in sorted(out) if t == T and b == B and m != "vanilla"), f"(vanilla {base:.2f} ms)")
