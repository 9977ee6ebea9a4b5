# The issue-13 protocol runs (e2e-b1/rK-DTYPE/records.jsonl): tok/s per method (sum of new tokens / sum of walls,
# prefill included), prefill seconds per prompt, ratios to our vanilla and to llama.cpp in the same run.
#   python e2e_table.py RUN_DIR...
import json, statistics, sys
from pathlib import Path
print("| run | prompts | method | tok/s | prefill ms/prompt | vs our vanilla | vs llama.cpp | greedy = vanilla |")
print("|---|---|---|---|---|---|---|---|")
for d in sys.argv[1:]:
    recs = [json.loads(l) for l in open(Path(d) / "records.jsonl")]
    prompt_dtype = json.load(open(Path(d) / "run.json"))["machine"].get("prompt_dtype", "?")
    tps, pre, mism = {}, {}, {}
    for m in dict.fromkeys(r["method"] for r in recs):
        rs = [r for r in recs if r["method"] == m]
        tps[m] = sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)
        pre[m] = statistics.mean(r["prefill_s"] or 0 for r in rs) * 1e3
        mism[m] = sum(bool(r["mismatch"]) for r in rs) if m != "vanilla" and rs[0]["exact"] else None
    for m in tps:
        same = "-" if mism[m] is None else f"{len([r for r in recs if r['method'] == m]) - mism[m]}/{len([r for r in recs if r['method'] == m])}"
        print(f"| {Path(d).name} (prompts {prompt_dtype}) | {len([r for r in recs if r['method'] == m])} | {m} | {tps[m]:.1f} | "
              f"{pre[m]:.0f} | {tps[m] / tps['vanilla']:.3f}x | {tps[m] / tps['llama.cpp']:.2f}x | {same} |")
