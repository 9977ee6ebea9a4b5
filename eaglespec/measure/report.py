"""`eaglespec report DIR`: tables (DIR/report.md) and PNG plots from the raw records of `eaglespec bench`.

Metrics (docs/BENCHMARKS.md, "Metrics"), each computed over a group of records by summing before dividing:
  tokens/s      sum of new tokens / sum of wall seconds, a record's seconds being its group's wall
                divided by the prompts in the group (batch 1: the prompt's own prefill + decode wall);
  speedup       tokens/s of a method / tokens/s of vanilla over the SAME prompts (same dataset, question,
                turn, batch size, temperature, seed);
  tau           new tokens in decode / target verification forwards = sum(new_tokens - 1) / sum(forwards)
                (the first token comes from the prefill, not from a decode step; tau counts the bonus token);
  acceptance(d) fraction of rounds (target forwards) in which the draft token at depth d was accepted;
  time shares   prefill, draft and verify seconds as a share of the sequences' wall time;
  mismatch      greedy records of a lossless method whose tokens differ from vanilla's for the same prompt;
  predicted     the cost model's speedup for the trees the dispatcher chose (`--tree auto`): sum of predicted
                tokens per round / sum of predicted step seconds, over calibrated plain tokens/s, pooled over
                the records; compared with the measured speedup above (docs/DISPATCH.md).
Cost curve: relative(N) = latency of a forward over N tokens / over 1 token at the same batch size, and the
bound speedup <= tau / (relative(N) + draft seconds per round / verify(1) seconds).
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from eaglespec.engine.stats import SequenceStats
from eaglespec.measure.records import COST_FILE, RECORDS_FILE, RUN_FILE, first_mismatch, read_records

Records = Sequence[dict]
PAIR_FIELDS = ("dataset", "question_id", "turn", "batch_size", "temperature", "seed")


# ============================================================================================ metrics
def tau(records: Records) -> float | None:
    """Pooled `SequenceStats.tau` of the records: sum(new_tokens - 1) / sum(target forwards after prefill)."""
    st = SequenceStats.pooled(SequenceStats.from_record(r) for r in records)
    return st.tau if st.target_forwards else None


def acceptance_by_position(records: Records) -> list[float]:
    """[d-1] = fraction of rounds in which the draft token at depth d was accepted."""
    rs = [r for r in records if r.get("target_forwards") and r.get("accepted_per_position") is not None]
    depth = max((max(len(r["accepted_per_position"]), r.get("tree_depth", 0)) for r in rs), default=0)
    st = SequenceStats.pooled(SequenceStats.from_record(r) for r in rs)
    return st.acceptance_by_position(depth) if st.target_forwards else []


def seconds(r: dict) -> float:
    """The wall seconds a record accounts for: its group's wall shared among the group's prompts."""
    return r["batch_wall_s"] / r["batch_n"]


def tokens_per_s(records: Records) -> float | None:
    total = sum(seconds(r) for r in records)
    return sum(r["new_tokens"] for r in records) / total if total > 0 else None


def pair_key(r: dict) -> tuple:
    return tuple(r[k] for k in PAIR_FIELDS)


def speedup(records: Records, vanilla: Records) -> float | None:
    """tokens/s of `records` / tokens/s of `vanilla`, both restricted to the prompts the two have in common."""
    ref = {pair_key(r): r for r in vanilla}
    pairs = [(r, ref[pair_key(r)]) for r in records if pair_key(r) in ref]
    if not pairs:
        return None
    mine, base = tokens_per_s([a for a, _ in pairs]), tokens_per_s([b for _, b in pairs])
    return mine / base if mine and base else None


def time_shares(records: Records) -> dict[str, float] | None:
    """Prefill / draft / verify seconds as shares of the sequences' own wall time (engine methods only)."""
    rs = [r for r in records if r.get("verify_s") is not None and r.get("wall_s")]
    wall = sum(r["wall_s"] for r in rs)
    if not wall:
        return None
    return {k: sum(r[f"{k}_s"] for r in rs) / wall for k in ("prefill", "draft", "verify")}


def find_mismatches(records: Records) -> list[tuple[dict, int]]:
    """(record, first differing token index) for every greedy record of a lossless method whose tokens differ
    from vanilla's on the same prompt. Recomputed from token ids: the records' own flags are not trusted."""
    vanilla = {pair_key(r): r for r in records if r["method"] == "vanilla"}
    out = []
    for r in records:
        ref = vanilla.get(pair_key(r))
        if r["method"] == "vanilla" or r["temperature"] != 0 or not r.get("exact", True) or ref is None:
            continue
        i = first_mismatch(r["token_ids"], ref["token_ids"])
        if i is not None:
            out.append((r, i))
    return out


def speedup_bound(tau_value: float, relative_cost: float, draft_over_verify1: float = 0.0) -> float:
    """docs/BENCHMARKS.md "Metrics": speedup <= tau / (verify(N) / verify(1) + draft_time / verify(1))."""
    return tau_value / (relative_cost + draft_over_verify1)


def relative_cost(curve: Records, batch: int, n: float) -> float:
    """verify(N) / verify(1) at `batch`, linearly interpolated between measured N (extrapolated past the ends)."""
    pts = sorted((c["n_tokens"], c["relative"]) for c in curve if c["batch_size"] == batch)
    if not pts:
        raise ValueError(f"the cost curve has no batch size {batch}")
    if len(pts) == 1:
        return pts[0][1]
    i = min(max(bisect.bisect_left([p[0] for p in pts], n), 1), len(pts) - 1)  # segment [i-1, i]
    (n0, r0), (n1, r1) = pts[i - 1], pts[i]
    return r0 + (r1 - r0) * (n - n0) / (n1 - n0)


def chain_tau(accept: float, nodes: int) -> float:
    """tau of a chain of nodes-1 drafts when each draft is accepted with probability `accept` given its parent."""
    return sum(accept**d for d in range(nodes))


# ============================================================================================ grouping
def _groups(records: Records, *fields: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        out[tuple(r[f] for f in fields)].append(r)
    return dict(out)


def _methods(records: Records) -> list[str]:
    """Methods in a stable order: vanilla first, then as they first appear."""
    names = list(dict.fromkeys(r["method"] for r in records))
    return sorted(names, key=lambda m: m != "vanilla")


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def hardware_line(records: Records) -> str:
    """'SmolLM2-135M-Instruct.Q4_1, float32, Intel Xeon (2 torch threads)' from the first record."""
    if not records:
        return ""
    r = records[0]
    m = r.get("machine", {})
    where = m.get("gpu") or f"{m.get('cpu', '?')} ({m.get('torch_threads', '?')} torch threads)"
    return f"{r.get('model', '?')}, {m.get('dtype', '?')}, {where}"


# ============================================================================================ tables
def _method_row(method: str, rs: list[dict], vanilla: list[dict]) -> str:
    acc = acceptance_by_position(rs)
    shares = time_shares(rs)
    mism = len(find_mismatches(rs + vanilla)) if method != "vanilla" else 0
    checked = sum(1 for r in rs if r["temperature"] == 0 and r.get("exact"))
    flag = "-" if not checked else (f"**{mism} of {checked}**" if mism else f"0 of {checked}")
    return "| " + " | ".join([
        method, rs[0].get("tree", "-"), str(len(rs)), str(sum(r["new_tokens"] for r in rs)),
        _fmt(tokens_per_s(rs), ".1f"), "1.00x" if method == "vanilla" else _fmt(speedup(rs, vanilla), ".2f", "x"),
        _fmt(tau(rs)), " / ".join(f"{a:.2f}" for a in acc) or "-",
        "-" if shares is None else " / ".join(f"{100 * shares[k]:.0f}" for k in ("prefill", "draft", "verify")),
        flag]) + " |"


def dataset_tables(records: Records) -> list[str]:
    """Per (dataset, temperature, batch size): a method table and a category table."""
    lines = []
    for (ds, temp, batch), rs in sorted(_groups(records, "dataset", "temperature", "batch_size").items()):
        by_method = _groups(rs, "method")
        vanilla = by_method.get(("vanilla",), [])
        lines += [f"### {ds}: T={temp:g}, batch size {batch}", "",
                  ("| method | tree | records | tokens | tokens/s | speedup | tau | acceptance by depth 1..k "
                   "| prefill / draft / verify % of wall | greedy mismatches |"),
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for m in _methods(rs):
            lines.append(_method_row(m, by_method[(m,)], vanilla))
        cats = sorted({r["category"] for r in rs})
        others = [m for m in _methods(rs) if m != "vanilla"]
        if len(cats) > 1 or (cats and cats[0]):
            lines += ["", "speedup over vanilla (tau) by category:", "",
                      "| category | vanilla tokens/s | " + " | ".join(others) + " |",
                      "|---|---|" + "---|" * len(others)]
            for cat in cats:
                crs = [r for r in rs if r["category"] == cat]
                cv = [r for r in crs if r["method"] == "vanilla"]
                cells = [f"{_fmt(speedup(mr, cv), '.2f', 'x')} ({_fmt(tau(mr))})"
                         for m in others for mr in [[r for r in crs if r["method"] == m]]]
                lines.append(f"| {cat or '(none)'} | {_fmt(tokens_per_s(cv), '.1f')} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def summary_table(records: Records) -> list[str]:
    """One row per dataset, temperature and method at the dataset's smallest batch size: the summary table."""
    rows = []
    for (ds, temp), rs in sorted(_groups(records, "dataset", "temperature").items()):
        batch, rs = at_smallest_batch(rs)
        vanilla = [r for r in rs if r["method"] == "vanilla"]
        for m in _methods(rs):
            mr = [r for r in rs if r["method"] == m]
            prompts = len({(r["question_id"], r["turn"]) for r in mr})
            sp = "1.00x" if m == "vanilla" else _fmt(speedup(mr, vanilla), ".2f", "x")
            rows.append(f"| {ds} | {temp:g} | {batch} | {m} | {prompts} | {sum(r['new_tokens'] for r in mr)} | "
                        f"{_fmt(tokens_per_s(mr), '.1f')} | {sp} | {_fmt(tau(mr))} |")
    if not rows:
        return []
    return ["## Summary", "", "Per dataset and temperature at its smallest batch size; speedup over vanilla on the same "
            "prompts (question x turn).", "",
            "| dataset | T | batch | method | prompts | tokens | tokens/s | speedup | tau |",
            "|---|---|---|---|---|---|---|---|---|", *rows, ""]


def every_batch_prompts(records: Records) -> tuple[list[dict], str]:
    """(records, description): the records of the prompts (dataset, question, turn) that ran at every batch size
    present, so that throughput across batch sizes compares the same work; all records, and a description that
    says so, when no prompt ran at all of them."""
    batches = {r["batch_size"] for r in records}
    seen: dict[tuple, set] = defaultdict(set)
    for r in records:
        seen[(r["dataset"], r["question_id"], r["turn"])].add(r["batch_size"])
    keep = {p for p, bs in seen.items() if bs == batches}
    if not keep:
        return list(records), f"all {len(seen)} prompts (none ran at every batch size: unequal work per batch size)"
    return [r for r in records if (r["dataset"], r["question_id"], r["turn"]) in keep], \
        f"the {len(keep)} prompts run at every batch size"


def dispatch_table(records: Records) -> list[str]:
    """Per dataset, temperature, batch size and method that ran the acceptance-aware dispatcher: the trees it
    chose, its predicted speedup against the measured one on the same prompts, and where they part (tokens
    per round: predicted vs tau; step and plain-step milliseconds: calibrated vs measured)."""
    lines = []
    for (ds, temp, batch), rs in sorted(_groups(records, "dataset", "temperature", "batch_size").items()):
        vanilla = [r for r in rs if r["method"] == "vanilla"]
        ref = {pair_key(r) for r in vanilla}
        for m in _methods(rs):
            mr = [r for r in rs if r["method"] == m and r.get("predicted_rounds") and pair_key(r) in ref]
            if not mr:
                continue
            vr = [r for r in vanilla if pair_key(r) in {pair_key(x) for x in mr}]
            st = SequenceStats.pooled(SequenceStats.from_record(r) for r in mr)
            plain = SequenceStats.pooled(SequenceStats.from_record(r) for r in vr)
            pred, meas = st.predicted_speedup, speedup(mr, vr)
            ratio = pred / meas if pred and meas else None
            rounds = sum(st.tree_rounds.values())
            trees = ", ".join(f"{k} {100 * v / rounds:.0f}%" for k, v in
                              sorted(st.tree_rounds.items(), key=lambda kv: -kv[1]))
            ms = (lambda x: 1e3 * (x.draft_s + x.verify_s) / x.target_forwards if x.verify_s else None)
            if not lines:
                lines += ["## Dispatcher: predicted vs measured", "",
                          ("`--tree auto` records: trees by share of verification rounds; predicted speedup (cost "
                           "model, pooled over the rounds) vs measured (tokens/s over vanilla's on the same "
                           "prompts); within 15% = |predicted / measured - 1| <= 0.15. Where they part: tokens per "
                           "round predicted vs measured (tau), step ms predicted vs measured, plain step ms "
                           "calibrated vs measured (vanilla)."), "",
                          "| dataset | T | batch | method | records | trees | predicted | measured | predicted / "
                          "measured | within 15% | tokens/round pred. / tau | step ms pred. / meas. | plain step ms "
                          "cal. / meas. |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            lines.append(
                f"| {ds} | {temp:g} | {batch} | {m} | {len(mr)} | {trees} | {_fmt(pred, '.2f', 'x')} | "
                f"{_fmt(meas, '.2f', 'x')} | {_fmt(ratio, '.2f')} | "
                f"{'-' if ratio is None else 'yes' if abs(ratio - 1) <= 0.15 else '**no**'} | "
                f"{st.predicted_tokens / st.predicted_rounds:.2f} / {_fmt(tau(mr))} | "
                f"{1e3 * st.predicted_s / st.predicted_rounds:.2f} / {_fmt(ms(st), '.2f')} | "
                f"{1e3 * st.predicted_vanilla_s / st.predicted_rounds:.2f} / {_fmt(ms(plain), '.2f')} |")
    return lines + [""] if lines else []


def batch_table(records: Records) -> list[str]:
    """tokens/s and speedup per method and batch size, per temperature, over the prompts run at every batch size."""
    lines = []
    for (temp,), rs in sorted(_groups(records, "temperature").items()):
        batches = sorted({r["batch_size"] for r in rs})
        if len(batches) < 2:
            continue
        rs, which = every_batch_prompts(rs)
        lines += [f"### Batch scaling, T={temp:g}: tokens/s (speedup), {which}", "",
                  "| method | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---|" * len(batches)]
        for m in _methods(rs):
            cells = []
            for b in batches:
                mr = [r for r in rs if r["method"] == m and r["batch_size"] == b]
                vr = [r for r in rs if r["method"] == "vanilla" and r["batch_size"] == b]
                cells.append(f"{_fmt(tokens_per_s(mr), '.1f')} ({_fmt(speedup(mr, vr), '.2f', 'x')})" if mr else "-")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


# ============================================================================================ cost curve
def read_cost_curve(out_dir: Path) -> list[dict]:
    path = Path(out_dir) / COST_FILE
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()] if path.is_file() else []


def measured_trees(records: Records) -> list[dict]:
    """Greedy speculative methods as (method, batch, tree nodes, tau, draft seconds per round)."""
    out = []
    for (m, b), rs in sorted(_groups([r for r in records if r["temperature"] == 0], "method", "batch_size").items()):
        t = tau(rs)
        forwards = sum(r["target_forwards"] or 0 for r in rs)
        if rs[0].get("method_kind") not in ("eagle", "replay") or t is None or not forwards:
            continue
        draft = sum(r["draft_s"] or 0.0 for r in rs) / forwards
        out.append({"method": m, "batch_size": b, "nodes": rs[0]["tree_nodes"], "tree": rs[0]["tree"], "tau": t,
                    "draft_s": draft})
    return out


def suggest_dispatcher(curve: Records, candidates: Sequence[dict]) -> dict[int, dict]:
    """Per batch size of the curve, the candidate with the highest bound. A candidate: {"label", "nodes", "tau",
    "draft_s" (per round, or "draft_ratio" = draft / verify(1))}."""
    best = {}
    for b in sorted({c["batch_size"] for c in curve}):
        v1 = next((c["median_s"] for c in curve if c["batch_size"] == b and c["n_tokens"] == 1), None)
        scored = []
        for cand in candidates:
            ratio = cand.get("draft_ratio", cand.get("draft_s", 0.0) / v1 if v1 else 0.0)
            scored.append((speedup_bound(cand["tau"], relative_cost(curve, b, cand["nodes"]), ratio), cand))
        bound, cand = max(scored, key=lambda x: x[0])
        best[b] = {**cand, "bound": bound}
    return best


def cost_curve_summary(out_dir: Path, taus: Sequence[float] | None = None, accept: float = 0.7,
                       draft_step: float = 0.05) -> str:
    """Relative costs, speedup bounds and a suggested tree size per batch size, as printable text.

    Tree sizes come from the greedy EAGLE records in DIR when there are some (their measured tau and draft
    time), else from a chain model: acceptance `accept` per depth and `draft_step` x verify(1) per draft step.
    """
    curve = read_cost_curve(out_dir)
    if not curve:
        return f"no {COST_FILE} in {out_dir}"
    ns = sorted({c["n_tokens"] for c in curve})
    lines = ["cost curve: verify(N) / verify(1)", "batch | " + " | ".join(f"N={n:>3}" for n in ns) + " | verify(1)"]
    for b in sorted({c["batch_size"] for c in curve}):
        cs = {c["n_tokens"]: c for c in curve if c["batch_size"] == b}
        lines.append(f"{b:>5} | " + " | ".join(f"{cs[n]['relative']:5.2f}" if n in cs else "    -" for n in ns)
                     + f" | {1e3 * cs[min(cs)]['median_s']:.2f} ms")
    records = read_records(Path(out_dir) / RECORDS_FILE)
    measured = [m for m in measured_trees(records) if m["method"].startswith("eagle")]
    if taus:
        lines += ["", "speedup bound tau / verify(N)/verify(1) (draft cost not included):"]
        for b in sorted({c["batch_size"] for c in curve}):
            for t in taus:
                lines.append(f"batch {b}, tau {t:.2f}: " + ", ".join(
                    f"N={n}: {speedup_bound(t, relative_cost(curve, b, n)):.2f}x" for n in ns))
    batches = sorted({c["batch_size"] for c in curve})
    if measured:
        source = "the greedy EAGLE records in this directory (tau and draft time at that batch size, else the smallest)"
        by_batch = {b: [{"label": f"{m['method']} [{m['tree']}]", "nodes": m["nodes"], "tau": m["tau"],
                         "draft_s": m["draft_s"]} for m in measured if m["batch_size"] == b]
                    for b in {m["batch_size"] for m in measured}}
        cands = {b: by_batch.get(b) or by_batch[min(by_batch)] for b in batches}
    else:
        source = (f"an ASSUMED chain model (no EAGLE records here): acceptance {accept} per depth, draft step = "
                  f"{draft_step} x verify(1); run the benchmark with eagle methods to replace the assumption")
        chains = [{"label": f"chain{n - 1}", "nodes": n, "tau": chain_tau(accept, n),
                   "draft_ratio": draft_step * (n - 1)} for n in range(2, max(ns) + 1)]
        cands = {b: chains for b in batches}
    vanilla = {"label": "vanilla (no speculation)", "nodes": 1, "tau": 1.0, "draft_ratio": 0.0}
    lines += ["", f"suggested dispatcher table from {source}:"]
    for b in batches:
        c = suggest_dispatcher([x for x in curve if x["batch_size"] == b], cands[b] + [vanilla])[b]
        lines.append(f"  batch >= {b}: {c['label']} (N={c['nodes']}, tau {c['tau']:.2f}) -> bound {c['bound']:.2f}x")
    return "\n".join(lines)


def bound_table(records: Records, curve: Records) -> list[str]:
    """Measured speedup next to the bound the cost curve implies for each greedy speculative method."""
    rows = []
    batches = {c["batch_size"] for c in curve}
    for m in measured_trees(records):
        b = m["batch_size"]
        if b not in batches:
            continue
        v1 = next(c["median_s"] for c in curve if c["batch_size"] == b and c["n_tokens"] == min(
            x["n_tokens"] for x in curve if x["batch_size"] == b))
        rel = relative_cost(curve, b, m["nodes"])
        ratio = m["draft_s"] / v1
        rs = [r for r in records if r["method"] == m["method"] and r["batch_size"] == b and r["temperature"] == 0]
        vr = [r for r in records if r["method"] == "vanilla" and r["batch_size"] == b and r["temperature"] == 0]
        rows.append(f"| {m['method']} | {b} | {m['nodes']} | {m['tau']:.2f} | {rel:.2f} | {ratio:.2f} | "
                    f"{speedup_bound(m['tau'], rel, ratio):.2f}x | {_fmt(speedup(rs, vr), '.2f', 'x')} |")
    if not rows:
        return []
    header = ("| method | batch | tree nodes N | tau | verify(N)/verify(1) | draft/verify(1) per round | bound | "
              "measured speedup |")
    note = ("The bound takes vanilla's time per token to be verify(1); where engine overhead is comparable to a "
            "forward (tiny models) the measured speedup can exceed it.")
    return [header, "|---|---|---|---|---|---|---|---|", *rows, "", note, ""]


# ============================================================================================ plots
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
STYLES = ("-", "--", "-.", ":")


def _figure(n_panels: int = 1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n_panels, figsize=(7.5 * n_panels if n_panels > 1 else 10, 5.4), squeeze=False)
    for ax in axes[0]:
        ax.grid(True, alpha=0.3)
    return fig, list(axes[0])


def _save(fig, out_dir: Path, name: str, title: str, subtitle: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.suptitle(title, fontsize=13, fontweight="bold", y=0.985)
    fig.text(0.5, 0.925, subtitle, ha="center", fontsize=9, color="0.3")
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name


def _label(method: str) -> str:
    """A method name for legends: `eagle:head=/long/path/my-head,chain3` -> `eagle:head=my-head,chain3`."""
    return re.sub(r"head=[^,]*/([^,/]+)/?", r"head=\1", method)


def _tag(x: float) -> str:
    return f"{x:g}".replace(".", "p")


def at_smallest_batch(rs: Records) -> tuple[int, list[dict]]:
    """(smallest batch size in rs, the records at that batch size): what per-dataset views compare."""
    batch = min(r["batch_size"] for r in rs)
    return batch, [r for r in rs if r["batch_size"] == batch]


def plot_speedup_by_category(out_dir: Path, rs: Records, dataset: str, temp: float, hw: str) -> str | None:
    batch, rs = at_smallest_batch(rs)
    vanilla = [r for r in rs if r["method"] == "vanilla"]
    methods = [m for m in _methods(rs) if m != "vanilla"]
    if not vanilla or not methods:
        return None
    cats = sorted({r["category"] for r in rs} - {""})
    groups = [(c, [r for r in rs if r["category"] == c]) for c in cats if len(cats) > 1] + [("all", rs)]
    fig, (ax,) = _figure()
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        vals = [speedup([r for r in g if r["method"] == m], [r for r in g if r["method"] == "vanilla"]) or 0.0
                for _, g in groups]
        t = tau([r for r in rs if r["method"] == m])
        bars = ax.bar([i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))], vals, width,
                      label=_label(m) + (f" (tau {t:.2f})" if t else ""))
        if len(groups) * len(methods) <= 40:
            ax.bar_label(bars, labels=[f"{v:.2f}x" for v in vals], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", lw=1, ls="--", label="vanilla = 1.0")
    ax.set_xticks(range(len(groups)), [c for c, _ in groups], rotation=30 if len(groups) > 8 else 0)
    ax.set_xlabel("category (all = every prompt of the dataset)")
    ax.set_ylabel("speedup over vanilla (tokens/s ratio, x)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    n = len({(r["question_id"], r["turn"]) for r in vanilla})
    return _save(fig, out_dir, f"speedup_{dataset}_T{_tag(temp)}.png",
                 f"Speedup over vanilla decoding by category: {dataset}, T={temp:g}, batch {batch}",
                 f"{hw}; {n} prompts (question x turn), tau in the legend")


def plot_acceptance(out_dir: Path, rs: Records, temp: float, hw: str) -> str | None:
    batch, rs = at_smallest_batch(rs)
    rs = [r for r in rs if r.get("accepted_per_position") is not None
          and r.get("method_kind") in ("eagle", "replay", "vllm-eagle")]
    if not rs:
        return None
    fig, (ax,) = _figure()
    depth = 1
    for i, m in enumerate(_methods(rs)):
        mr = [r for r in rs if r["method"] == m]
        acc = acceptance_by_position(mr)
        if not acc:
            continue
        depth = max(depth, len(acc))
        ax.plot(range(1, len(acc) + 1), acc, marker=MARKERS[i % len(MARKERS)], ls=STYLES[i % len(STYLES)],
                ms=8 - i % 3, label=f"{_label(m)} (tau {tau(mr):.2f})")
    ax.set_xticks(range(1, depth + 1))
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("draft depth d (1 = first drafted token after the pending one)")
    ax.set_ylabel("acceptance rate: rounds with depth d accepted / all rounds")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, out_dir, f"acceptance_T{_tag(temp)}.png",
                 f"Acceptance by draft position: T={temp:g}, batch {batch}, all datasets", hw)


def plot_batch_scaling(out_dir: Path, rs: Records, temp: float, hw: str) -> str | None:
    batches = sorted({r["batch_size"] for r in rs})
    if len(batches) < 2:
        return None
    rs, which = every_batch_prompts(rs)
    fig, (ax_tp, ax_sp) = _figure(2)
    for m in _methods(rs):
        tp, sp, bs = [], [], []
        for b in batches:
            mr = [r for r in rs if r["method"] == m and r["batch_size"] == b]
            if mr:
                bs.append(b)
                tp.append(tokens_per_s(mr) or 0.0)
                sp.append(speedup(mr, [r for r in rs if r["method"] == "vanilla" and r["batch_size"] == b]) or 0.0)
        ax_tp.plot(bs, tp, marker="o", label=_label(m))
        ax_sp.plot(bs, sp, marker="o", label=_label(m))
    for ax in (ax_tp, ax_sp):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch size (prompts decoded together)")
    ax_tp.set_ylabel("throughput (generated tokens/s, all rows)")
    ax_tp.set_title("throughput")
    ax_sp.set_ylabel("speedup over vanilla at the same batch size (x)")
    ax_sp.set_title("speedup")
    ax_sp.axhline(1.0, color="black", lw=1, ls="--")
    ax_sp.legend(fontsize=8)
    return _save(fig, out_dir, f"batch_scaling_T{_tag(temp)}.png",
                 f"Throughput and speedup vs batch size: T={temp:g}, {which}", hw)


def plot_tau_vs_tree(out_dir: Path, rs: Records, temp: float, hw: str) -> str | None:
    batch, rs = at_smallest_batch(rs)
    vanilla = [r for r in rs if r["method"] == "vanilla"]
    points = []
    for m in _methods(rs):
        mr = [r for r in rs if r["method"] == m]
        t = tau(mr)
        if t is not None and mr[0].get("tree_nodes", 1) > 1:
            points.append((mr[0]["tree_nodes"], t, m, speedup(mr, vanilla)))
    if not points:
        return None
    fig, (ax,) = _figure()
    for nodes, t, m, sp in points:
        ax.scatter([nodes], [t], s=50)
        ax.annotate(_label(m) + (f"\n{sp:.2f}x" if sp else ""), (nodes, t), textcoords="offset points",
                    xytext=(6, 4), fontsize=8)
    ax.axhline(1.0, color="black", lw=1, ls="--", label="tau = 1 (no gain)")
    ax.set_xlabel("tree size N (nodes verified per round, root included)")
    ax.set_ylabel("tau (new tokens per target forward)")
    ax.set_xlim(0, max(p[0] for p in points) * 1.25 + 1)
    ax.set_ylim(0, max(p[1] for p in points) * 1.2 + 0.2)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, out_dir, f"tau_vs_tree_T{_tag(temp)}.png",
                 f"tau vs tree size: T={temp:g}, batch {batch}, all datasets (labels: method, speedup)", hw)


def plot_cost_curve(out_dir: Path, curve: Records, hw: str) -> str | None:
    if not curve:
        return None
    fig, (ax_rel, ax_abs) = _figure(2)
    ns = sorted({c["n_tokens"] for c in curve})
    for b in sorted({c["batch_size"] for c in curve}):
        cs = sorted((c for c in curve if c["batch_size"] == b), key=lambda c: c["n_tokens"])
        ax_rel.plot([c["n_tokens"] for c in cs], [c["relative"] for c in cs], marker="o", label=f"batch {b}")
        med = [1e3 * c["median_s"] for c in cs]
        ax_abs.errorbar([c["n_tokens"] for c in cs], med, yerr=[[m - 1e3 * c["min_s"] for m, c in zip(med, cs)],
                                                                [1e3 * c["max_s"] - m for m, c in zip(med, cs)]],
                        marker="o", capsize=3, label=f"batch {b}")
    for ax in (ax_rel, ax_abs):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("tokens N verified per row in one forward (tree-masked block)")
        ax.legend(fontsize=8)
    ax_rel.set_ylabel("verify(N) / verify(1) at the same batch size")
    ax_rel.set_title("relative cost (what a bigger tree costs)")
    ax_abs.set_ylabel("forward latency (ms): median, whiskers min..max")
    ax_abs.set_title("absolute latency")
    prefix = curve[0]["prefix"]
    return _save(fig, out_dir, "cost_curve.png", f"Target forward cost vs tokens per forward ({prefix}-token prefix)",
                 hw)


def _overview_methods(records: Records) -> list[str]:
    """Methods of the overview plot: every non-vanilla method, except named variants of `eagle` (tree shapes,
    other heads) that ran only where the default `eagle` ran too: those are in the per-dataset and tau-vs-tree
    plots."""
    groups = _groups(records, "dataset", "temperature")
    ran = {m: {g for g, rs in groups.items() if any(r["method"] == m for r in rs)} for m in _methods(records)}
    return [m for m in ran if m != "vanilla" and not (m.startswith("eagle:") and ran[m] <= ran.get("eagle", set()))]


def plot_overview(out_dir: Path, records: Records, hw: str) -> str | None:
    """The main plot: speedup over vanilla per dataset (x) and method (bars), one panel per temperature, each
    dataset at its smallest batch size; bars are labelled with the speedup and tau."""
    temps = sorted({r["temperature"] for r in records})
    methods = _overview_methods(records)
    datasets = sorted({r["dataset"] for r in records})
    if not methods or not any(r["method"] == "vanilla" for r in records):
        return None
    views = {key: at_smallest_batch(rs)[1] for key, rs in _groups(records, "dataset", "temperature").items()}
    fig, axes = _figure(len(temps))
    top = 1.0
    for ax, temp in zip(axes, temps):
        width = 0.8 / len(methods)
        for j, m in enumerate(methods):
            xs, vals, labels = [], [], []
            for i, ds in enumerate(datasets):
                rs = views.get((ds, temp), [])
                mr = [r for r in rs if r["method"] == m]
                sp = speedup(mr, [r for r in rs if r["method"] == "vanilla"])
                if sp is None:
                    continue
                t = tau(mr)
                xs.append(i + (j - (len(methods) - 1) / 2) * width)
                vals.append(sp)
                labels.append(f"{sp:.2f}x" + (f"\ntau {t:.2f}" if t is not None else ""))
            if xs:
                bars = ax.bar(xs, vals, width, label=_label(m), color=f"C{j}")
                ax.bar_label(bars, labels=labels, fontsize=7, padding=1)
                top = max(top, *vals)
        ax.axhline(1.0, color="black", lw=1, ls="--")
        ax.set_xticks(range(len(datasets)), datasets, rotation=20 if len(datasets) > 4 else 0)
        ax.set_title(f"T={temp:g}" + (" (greedy)" if temp == 0 else " (sampling)"))
        ax.set_ylabel("speedup over vanilla (tokens/s ratio, x); dashed: vanilla")
    handles = {}  # every method once, whichever panel drew it
    for ax in axes:
        ax.set_ylim(0, top * 1.25)
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))
    axes[0].legend(handles.values(), handles.keys(), fontsize=8, loc="upper left")
    return _save(fig, out_dir, "overview.png", "Speedup over vanilla decoding by dataset and method",
                 f"{hw}; each dataset at its smallest batch size; bar labels: speedup and tau")


def make_plots(out_dir: Path, records: Records, curve: Records) -> list[tuple[str, str]]:
    """Write every plot that the data supports; returns (file name, one-line description)."""
    hw = hardware_line(records or curve)
    images = []
    name = plot_overview(out_dir, records, hw) if records else None
    if name:
        images.append((name, "Overview: speedup over vanilla per dataset and method, per temperature."))
    for (ds, temp), rs in sorted(_groups(records, "dataset", "temperature").items()):
        name = plot_speedup_by_category(out_dir, rs, ds, temp, hw)
        if name:
            images.append((name, f"Speedup over vanilla per category of {ds} at T={temp:g} (bars: methods)."))
    for (temp,), rs in sorted(_groups(records, "temperature").items()):
        for fn, desc in ((plot_acceptance, "Acceptance rate by draft depth"),
                         (plot_batch_scaling, "Throughput and speedup vs batch size"),
                         (plot_tau_vs_tree, "tau vs tree size")):
            name = fn(out_dir, rs, temp, hw)
            if name:
                images.append((name, f"{desc}, T={temp:g}."))
    name = plot_cost_curve(out_dir, curve, hw)
    if name:
        images.append((name, "Target forward latency over N tokens, relative to N = 1, per batch size."))
    return images


# ============================================================================================ report
def write_report(out_dir: Path, plots: bool = True) -> Path:
    """DIR/report.md (+ PNG plots next to it) from DIR/records.jsonl and DIR/cost_curve.jsonl."""
    out_dir = Path(out_dir)
    records = read_records(out_dir / RECORDS_FILE)
    curve = read_cost_curve(out_dir)
    run = json.loads((out_dir / RUN_FILE).read_text()) if (out_dir / RUN_FILE).is_file() else {}
    hw = hardware_line(records or curve)
    lines = ["# Benchmark report", "", f"Model and hardware: {hw}." if hw else "",
             ("Metric definitions: docs/BENCHMARKS.md. Speedups compare each method with "
              "vanilla decoding on the same prompts; tau counts the bonus token."), ""]
    if run.get("settings"):
        lines += ["Settings: " + ", ".join(f"{k}={v}" for k, v in run["settings"].items()), ""]
    for m, why in run.get("skipped", {}).items():
        lines.append(f"- skipped `{m}`: {why}")
    mism = find_mismatches(records)
    if mism:
        lines += ["", (f"**GREEDY MISMATCHES: {len(mism)} record(s) differ from vanilla's tokens** "
                       "(fp32 should be exact; bf16/fp16 may differ through reduction order):"), ""]
        lines += [f"- {r['dataset']} {r['question_id']} turn {r['turn']} {r['method']} batch {r['batch_size']}: "
                  f"first difference at token {i}" for r, i in mism[:50]]
    elif records:
        lines += ["", "Greedy outputs of every lossless method equal vanilla's (no mismatch)."]
    lines.append("")
    if records:
        lines += [*summary_table(records), *dispatch_table(records), "## Results per dataset", "",
                  *dataset_tables(records), *batch_table(records)]
    if curve:
        lines += ["## Cost curve", "", "```", cost_curve_summary(out_dir), "```", "", *bound_table(records, curve)]
    if plots:
        images = make_plots(out_dir, records, curve)
        if images:
            lines += ["## Plots", ""] + [f"![{desc}]({name})  \n{desc}\n" for name, desc in images]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ============================================================================================ CLI
def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="write DIR/report.md and plots from a bench run's records",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("dir", metavar="DIR", help="the --out directory of `eaglespec bench`")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    if not (out / RECORDS_FILE).is_file() and not (out / COST_FILE).is_file():
        raise ValueError(f"{out} has neither {RECORDS_FILE} nor {COST_FILE}: run `eaglespec bench --out {out}` first")
    print(f"report: {write_report(out, plots=not args.no_plots)}")
    return 0
