# Where auto's wall time differs from vanilla's in a matrix cell, from bench records: per (T, batch), auto over
# vanilla for the wall time and each recorded part (prefill, draft = propose + commit, verify = target forward +
# verification), the parts' differences as a share of vanilla's wall time, and auto's rounds by tree.
#   python phase_split.py RUN/mt_bench RUN/spec_bench ...
import collections
import json
import sys

for d in sys.argv[1:]:
    parts = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])  # wall, prefill, draft, verify
    rounds = collections.defaultdict(collections.Counter)
    for line in open(f"{d}/records.jsonl"):
        r = json.loads(line)
        if r["method"] not in ("vanilla", "eagle:auto"):
            continue
        k = (r["temperature"], r["batch_size"])
        p = parts[k + (r["method"],)]
        for i, name in enumerate(("wall_s", "prefill_s", "draft_s", "verify_s")):
            p[i] += r[name]
        if r["method"] == "eagle:auto":
            rounds[k].update(r["tree_rounds"])
    for k in sorted(rounds):
        a, v = parts[k + ("eagle:auto",)], parts[k + ("vanilla",)]
        share = lambda i: (a[i] - v[i]) / v[0] * 100  # noqa: E731
        print(f"{d.rstrip('/').split('/')[-1]:10s} T={k[0]:g} b{k[1]}  wall {a[0] / v[0]:.3f}  prefill {share(1):+5.2f}%  "
              f"draft {share(2):+5.2f}%  verify {share(3):+5.2f}%  rounds {dict(rounds[k])}")
