# Each method of a bench run (records.jsonl) against vanilla, per temperature and batch size, over the requests
# both ran: speed (summed wall, vanilla's over the method's), prefill seconds (method's over vanilla's), verify
# and draft ms per target forward, and how many requests produced vanilla's tokens exactly; "paused" rows keep
# the requests the method never drafted for (one node a round).
#   python paired.py RECORDS.jsonl
import json
import sys

recs = [json.loads(line) for line in open(sys.argv[1])]
for T in sorted({r["temperature"] for r in recs}):
    for B in sorted({r["batch_size"] for r in recs}):
        by = {}
        for r in recs:
            if r["temperature"] == T and r["batch_size"] == B:
                by.setdefault(r["method"], {})[(r["question_id"], r["turn"])] = r
        base = by.get("vanilla")
        if base is None:
            continue
        for m, a in by.items():
            if m == "vanilla":
                continue
            for kind in ("all", "paused"):
                ks = [k for k in base if k in a and (kind == "all" or a[k]["tree_nodes"] == 1.0)]
                if not ks:
                    continue
                V, A = [base[k] for k in ks], [a[k] for k in ks]
                total = lambda rs, f: sum(f(r) for r in rs)  # noqa: E731
                fwd = total(A, lambda r: r["target_forwards"])
                print(f"T={T:g} batch {B} {m:16s} {kind:6s} n={len(ks):2d} "
                      f"speed {total(V, lambda r: r['wall_s']) / total(A, lambda r: r['wall_s']):.3f} "
                      f"prefill x{total(A, lambda r: r['prefill_s']) / total(V, lambda r: r['prefill_s']):.3f} "
                      f"verify {total(A, lambda r: r['verify_s']) / fwd * 1e3:.3f} ms/fwd "
                      f"(vanilla {total(V, lambda r: r['verify_s']) / total(V, lambda r: r['target_forwards']) * 1e3:.3f}) "
                      f"draft {total(A, lambda r: r['draft_s']) / fwd * 1e3:.3f} ms/fwd "
                      f"vanilla's tokens {sum(a[k]['token_ids'] == base[k]['token_ids'] for k in ks)}/{len(ks)}")
