"""Issue 14 table from dispatch_matrix.sh output: per dataset, T and batch, auto and fixed trees over vanilla
(tokens pooled over the prompts / wall seconds pooled), the per-prompt median, the criteria, and predicted.

usage: python scripts/dispatch_table.py OUT/mt_bench OUT/spec_bench ...
       python scripts/dispatch_table.py R1/mt_bench R2/mt_bench R1/spec_bench R2/spec_bench ...

Several directories of the same dataset are repeated runs (dispatch_matrix.sh run into R1, R2, ...): each cell
then shows the median over the runs of each run's pooled ratio, with auto's range over the runs, and the
criteria are judged on the medians (one run per cell cannot settle a 2% criterion on a noisy machine).

The noise column: a 95% bootstrap interval of auto's pooled ratio over the cell's groups (the prompts decoded
together, which the bench runs back to back with every method; each group pairs auto's tokens and seconds
with vanilla's), the groups of every run resampled together, 2000 draws, seeded."""
import collections
import json
import random
import statistics
import sys

BOOTSTRAP_DRAWS = 2000


def groups(records):
    """(dataset, T, batch) -> [(auto tokens, auto seconds, vanilla tokens, vanilla seconds)] per group: each
    method's records of a cell, in the order the bench ran them, cut into batches of the cell's batch size."""
    per = collections.defaultdict(list)
    for r in records:
        if r["method"] in ("eagle:auto", "vanilla"):
            per[(r["dataset"], r["temperature"], r["batch_size"], r["method"])].append(r)
    out = {}
    for k in {key[:3] for key in per}:
        auto, van = per[k + ("eagle:auto",)], per[k + ("vanilla",)]
        if len(auto) != len(van) or [r["question_id"] for r in auto] != [r["question_id"] for r in van]:
            raise ValueError(f"{k}: auto and vanilla ran different prompts")
        b = k[2]
        out[k] = [(sum(r["new_tokens"] for r in auto[i:i + b]), sum(r["wall_s"] for r in auto[i:i + b]),
                   sum(r["new_tokens"] for r in van[i:i + b]), sum(r["wall_s"] for r in van[i:i + b]))
                  for i in range(0, len(auto), b)]
    return out


def bootstrap_interval(gs, draws=BOOTSTRAP_DRAWS, seed=0):
    """The 2.5th and 97.5th percentiles of the pooled ratio (auto tokens/s over vanilla's) over groups ``gs``
    resampled with replacement."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        pick = [gs[rng.randrange(len(gs))] for _ in gs]
        ratios.append((sum(g[0] for g in pick) / sum(g[1] for g in pick))
                      / (sum(g[2] for g in pick) / sum(g[3] for g in pick)))
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def cell_ratios(records):
    """(dataset, T, batch) -> {method: tokens/s over vanilla's}, per-prompt auto/vanilla ratios, predicted."""
    tok = collections.defaultdict(lambda: [0, 0.0])
    per = collections.defaultdict(dict)
    pred = collections.defaultdict(lambda: [0.0, 0.0])
    for r in records:
        k = (r["dataset"], r["temperature"], r["batch_size"])
        tok[k + (r["method"],)][0] += r["new_tokens"]
        tok[k + (r["method"],)][1] += r["wall_s"]
        per[k + (r["question_id"],)][r["method"]] = r["new_tokens"] / r["wall_s"]
        if r["method"] == "eagle:auto" and r.get("predicted_speedup") is not None:
            pred[k][0] += r["predicted_speedup"] * r["new_tokens"]
            pred[k][1] += r["new_tokens"]
    out = {}
    for k in sorted({key[:3] for key in tok}):
        tps = {key[3]: n / s for key, (n, s) in tok.items() if key[:3] == k}
        ratios = [d["eagle:auto"] / d["vanilla"] for kk, d in per.items() if kk[:3] == k
                  and "eagle:auto" in d and "vanilla" in d]
        out[k] = {"vanilla": tps["vanilla"], "ratio": {m: v / tps["vanilla"] for m, v in tps.items()},
                  "per_prompt": ratios, "prompts": sum(1 for kk in per if kk[:3] == k),
                  "predicted": pred[k][0] / pred[k][1] if pred[k][1] else float("nan")}
    return out


def main(dirs):
    runs = collections.defaultdict(list)  # cell -> one entry per run
    paired = collections.defaultdict(list)  # cell -> the groups of every run
    mismatches = 0
    for d in dirs:
        records = [json.loads(line) for line in open(f"{d}/records.jsonl")]
        mismatches += sum(bool(r.get("mismatch")) for r in records)
        for k, cell in cell_ratios(records).items():
            runs[k].append(cell)
        for k, gs in groups(records).items():
            paired[k] += gs
    order = list(dict.fromkeys(k[0] for k in runs))  # datasets in the order given
    print("| dataset | T | batch | prompts | vanilla tok/s | auto | auto, 95% interval over groups | auto, per-prompt "
          "median | fixed trees (chains, by depth) | best fixed | auto >= 0.98x | auto within 5% of the best | predicted | "
          "predicted / measured |")
    print("|" + "---|" * 14)
    for k in sorted(runs, key=lambda k: (order.index(k[0]), k[1], k[2])):
        cells = runs[k]
        med = lambda f: statistics.median(f(c) for c in cells)  # noqa: E731
        auto = med(lambda c: c["ratio"]["eagle:auto"])
        # a fixed tree's median over the runs that ran it (a repeat may run fewer trees: TREES="chain1")
        fixed = {m: statistics.median(c["ratio"][m] for c in cells if m in c["ratio"])
                 for m in dict.fromkeys(m for c in cells for m in c["ratio"]) if m.startswith("eagle:chain")}
        best = max(fixed, key=fixed.get)
        pred = med(lambda c: c["predicted"])
        autos = [c["ratio"]["eagle:auto"] for c in cells]
        spread = f" ({min(autos):.3f}-{max(autos):.3f}, {len(cells)} runs)" if len(cells) > 1 else ""
        lo, hi = bootstrap_interval(paired[k])
        print(f"| {k[0]} | {k[1]:g} | {k[2]} | {cells[0]['prompts']} | {med(lambda c: c['vanilla']):.1f} | "
              f"**{auto:.3f}x**{spread} | {lo:.3f}-{hi:.3f} ({len(paired[k])} groups) | "
              f"{statistics.median(r for c in cells for r in c['per_prompt']):.3f}x | "
              f"{' / '.join(f'{fixed[m]:.2f}' for m in sorted(fixed))} | {best.split(':')[1]} {fixed[best]:.2f}x | "
              f"{'yes' if auto >= 0.98 else 'no'} | {'yes' if auto >= fixed[best] * 0.95 else 'no'} | {pred:.2f}x | "
              f"{pred / auto:.2f} |")
    print("greedy mismatches:", mismatches, file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
