# Per matrix cell: auto's and vanilla's summed draft_s and verify_s (seconds, over requests) and decode wall.
import json, sys, collections
for run in sys.argv[1:]:
    for ds in ("mt_bench", "spec_bench", "humaneval"):
        recs = [json.loads(l) for l in open(f"{run}/{ds}/records.jsonl")]
        for T in (0.0, 1.0):
            for B in (4,):
                s = collections.defaultdict(lambda: [0.0, 0.0])
                for r in recs:
                    if r["temperature"] == T and r["batch_size"] == B and r["method"] in ("vanilla", "eagle:auto"):
                        s[r["method"]][0] += r["draft_s"]; s[r["method"]][1] += r["verify_s"]
                print(run.split("/")[-1], ds, T, B, " ".join(f"{m} draft {v[0]:.2f}s verify {v[1]:.2f}s" for m, v in s.items()))
