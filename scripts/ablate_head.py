"""Helpers of scripts/ablate_head.sh (issue 11: fixed-budget ablations of the SmolLM2-135M-Instruct head).

  python scripts/ablate_head.py arms                      # name|data set|train flags|chain depths|fixed head
  python scripts/ablate_head.py cost --work W --out F     # the draft's own cost per finished arm (batch 1)
  python scripts/ablate_head.py collect --work W --costs F --out DIR   # results.jsonl + table.md

The arms change ONE thing each against the baseline (EAGLE-3, 1 layer, draft vocabulary 8192, TTT 3, soft
labels, regenerated answers). Costs reuse the calibration's timers (``engine.calibrate.measure_verify`` and
``measure_draft``: the engine drafting a chain on a fixed prompt, warm-up excluded); several rounds are run
with the arms interleaved and the median of each kept, so a pause or a busy neighbour hits every arm alike.
The predicted speedup is ``costmodel.predicted_speedup`` with the expected tokens of the chain from the
per-depth acceptance measured through the engine on MT-bench first turns.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Arm:
    name: str
    change: str
    data: str  # "regen" or "orig"
    flags: tuple[str, ...] = ()
    chains: tuple[int, ...] = (3,)  # chain depths measured through the engine
    head: str | None = None  # a fixed head (repository path) instead of a training run: a reference, no budget
    summary: str | None = None  # its training summary (repository path)


# Order = run order: the ones to drop under time pressure last (32K first, then TTT 6).
ARMS: tuple[Arm, ...] = (
    Arm("baseline", "baseline (EAGLE-3, 1 layer, V' 8192, TTT 3, soft, regenerated)", "regen"),
    Arm("hard", "hard labels (CE to the target's argmax)", "regen", ("--labels", "hard")),
    Arm("layers2", "2 decoder layers", "regen", ("--num-layers", "2")),
    Arm("vocab16k", "draft vocabulary 16384", "regen", ("--draft-vocab-size", "16384")),
    Arm("vocabfull", "draft vocabulary = full 49152", "regen", ("--draft-vocab-size", "none")),
    Arm("original", "original answers (same sources, ~same assistant tokens), same epochs: 92 steps", "orig"),
    Arm("original64", "original answers, same 64 steps (1.4 epochs)", "orig"),
    Arm("ttt6", "TTT 6 steps", "regen", ("--ttt-steps", "6"), (3, 6)),
    Arm("vocab32k", "draft vocabulary 32768", "regen", ("--draft-vocab-size", "32768")),
    Arm("shipped", "reference: the shipped head (fine-tuned on 721K answer tokens, 3.15M token-passes)", "ref",
        head="eaglespec/assets/smollm2-135m-instruct-eagle", summary="docs/results/head-2026-11-24/train_summary.json"),
)


def arm(name: str) -> Arm:
    for a in ARMS:
        if a.name == name:
            return a
    raise SystemExit(f"unknown arm {name!r}; arms: {', '.join(a.name for a in ARMS)}")


def head_dir(work: Path, a: Arm) -> Path:
    return Path(a.head) if a.head else work / "arms" / a.name / "out" / "head"


def finished(work: Path) -> list[Arm]:
    """Arms whose training wrote its final head."""
    return [a for a in ARMS if (head_dir(work, a) / "config.json").is_file()]


def cmd_arms(_: argparse.Namespace) -> int:
    for a in ARMS:
        print("|".join([a.name, a.data, " ".join(a.flags), ",".join(map(str, a.chains)), a.head or ""]))
    return 0


def measure_costs(work: Path, arms: list[Arm], rounds: int, model: str | None,
                  on_round: Callable[[dict], None] | None = None) -> dict:
    """Median seconds per drafting step (chain d, batch 1) per arm and of verify(1, n), over ``rounds``;
    ``on_round`` gets the summary so far after every round (a killed run keeps its finished rounds)."""
    from eaglespec.engine.calibrate import LONG_STEPS, SHORT_STEPS, measure_draft, measure_verify
    from eaglespec.runtime.loading import load_target
    from eaglespec.spec.heads import load_head
    from eaglespec.spec.proposer import EagleProposer
    from eaglespec.spec.strategies import Chain

    target = load_target(model, dtype="float32")
    heads = {a.name: load_head(head_dir(work, a), target.model, dtype=target.model.dtype).eval() for a in arms}
    depths = sorted({d for a in arms for d in cost_depths(a)})
    verify: dict[int, list[float]] = {}
    draft: dict[str, dict[int, list[float]]] = {a.name: {} for a in arms}
    for r in range(rounds):
        t0 = time.perf_counter()
        for (_, n), s in measure_verify(target.model, (1,), tuple([1] + [d + 1 for d in depths])).items():
            verify.setdefault(n, []).append(s)
        for a in arms:
            def make(tree, head=heads[a.name]):
                return EagleProposer(head, tree)
            cands = {f"chain{d}": Chain(d) for d in cost_depths(a)}
            # without a cost table: the head's own seconds per step, a SHORT_STEPS run's less a LONG_STEPS run's
            for (_, label), s in measure_draft(target, make, cands, (1,)).items():
                draft[a.name].setdefault(int(label[len("chain"):]), []).append(s)
        print(f"round {r + 1}/{rounds}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        if on_round is not None:
            on_round(_cost_summary(verify, draft, rounds, r + 1, f"{SHORT_STEPS}/{LONG_STEPS}"))
    return _cost_summary(verify, draft, rounds, rounds, f"{SHORT_STEPS}/{LONG_STEPS}")


def _cost_summary(verify: dict[int, list[float]], draft: dict[str, dict[int, list[float]]], rounds: int,
                  done: int, steps: str) -> dict:
    import torch

    from eaglespec.runtime.quant import machine_fingerprint

    return {"machine": machine_fingerprint(), "torch": torch.__version__, "rounds": rounds, "rounds_done": done,
            "steps": steps, "verify_s": {str(n): statistics.median(v) for n, v in sorted(verify.items())},
            "verify_all_s": {str(n): v for n, v in sorted(verify.items())},
            "draft_s": {name: {str(d): statistics.median(v) for d, v in sorted(ds.items())}
                        for name, ds in draft.items()},
            "draft_all_s": {name: {str(d): v for d, v in sorted(ds.items())} for name, ds in draft.items()}}


def cost_depths(a: Arm) -> tuple[int, ...]:
    """Chain depths whose drafting is timed: the measured chains and chain 1 (its tokens per round follow
    from the depth-1 acceptance of any greedy chain: its first draft token is the same)."""
    return tuple(sorted({1, *a.chains}))


def cmd_cost(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    arms = finished(work)
    if not arms:
        raise SystemExit(f"no finished arm under {work}/arms")
    out = Path(args.out)
    if out.is_file() and not args.force:
        old = json.loads(out.read_text())
        if {a.name for a in arms} <= set(old["draft_s"]) and old.get("rounds_done", old["rounds"]) >= old["rounds"]:
            print(f"{out}: every finished arm is measured (--force measures again)", file=sys.stderr)
            return 0
    def save(res: dict) -> None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(res, indent=1))
        tmp.replace(out)

    res = measure_costs(work, arms, args.rounds, args.model, on_round=save)
    print(json.dumps({k: res[k] for k in ("machine", "verify_s", "draft_s")}, indent=1))
    return 0


def engine_acceptance(bench_dir: Path, depth: int) -> dict | None:
    """Pooled tau and per-depth acceptance of the chain-``depth`` records of a bench run (None if absent)."""
    from eaglespec.engine.stats import SequenceStats

    path = bench_dir / "records.jsonl"
    if not path.is_file():
        return None
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    recs = [r for r in recs if r.get("method_kind") == "eagle" and r.get("tree") == f"chain{depth}"]
    if not recs:
        return None
    st = SequenceStats.pooled(SequenceStats.from_record(r) for r in recs)
    per_prompt = {f"{r['question_id']}:{r['turn']}": [(r.get("accepted_per_position") or [0])[0],
                                                     r.get("target_forwards") or 0] for r in recs}
    return {"per_prompt_d1": per_prompt, "prompts": len(recs), "new_tokens": st.new_tokens, "rounds": st.target_forwards,
            "tau": round(st.tau, 4), "acceptance_by_depth": [round(x, 4) for x in st.acceptance_by_position(depth)],
            "mismatches": sum(bool(r.get("mismatch")) for r in recs)}


def paired_delta_d1(arm: dict, base: dict, resamples: int = 2000, seed: int = 0) -> dict | None:
    """Depth-1 acceptance of ``arm`` minus ``base`` (pooled over prompts) with a 95% interval from a paired
    bootstrap over the prompts both ran (rounds within a prompt are correlated: prompts are the unit)."""
    import random

    keys = sorted(set(arm["per_prompt_d1"]) & set(base["per_prompt_d1"]))
    if not keys:
        return None

    def delta(ks: list[str]) -> float:
        a_hit = sum(arm["per_prompt_d1"][k][0] for k in ks)
        a_n = sum(arm["per_prompt_d1"][k][1] for k in ks)
        b_hit = sum(base["per_prompt_d1"][k][0] for k in ks)
        b_n = sum(base["per_prompt_d1"][k][1] for k in ks)
        return a_hit / max(a_n, 1) - b_hit / max(b_n, 1)

    rng = random.Random(seed)
    boots = sorted(delta([rng.choice(keys) for _ in keys]) for _ in range(resamples))
    return {"delta": round(delta(keys), 4), "ci95": [round(boots[int(0.025 * resamples)], 4),
                                                     round(boots[int(0.975 * resamples) - 1], 4)],
            "prompts": len(keys)}


def greedy_tokens(work: Path) -> list[int]:
    """The target's greedy answers to the bench prompts (every arm's output equals plain greedy decoding, so
    the baseline's records serve all arms)."""
    path = work / "arms" / "baseline" / "bench" / "records.jsonl"
    if not path.is_file():
        return []
    return [t for line in path.read_text().splitlines() if line.strip() for t in json.loads(line)["token_ids"]]


def coverage(directory: Path, tokens: list[int]) -> float | None:
    """Share of ``tokens`` inside the head's draft vocabulary (target id = draft id + d2t[draft id]): a token
    outside it is never drafted, so this bounds the depth-1 acceptance from above."""
    import torch
    from safetensors import safe_open

    if not tokens:
        return None
    for f in directory.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            if "d2t" in st.keys():
                d2t = st.get_tensor("d2t")
                ids = set((d2t + torch.arange(d2t.numel())).tolist())
                return round(sum(t in ids for t in tokens) / len(tokens), 4)
    return 1.0  # no d2t: the full vocabulary


def conditional(acc: list[float]) -> list[float]:
    """Conditional acceptance a_d = P(depth d | depth d - 1) from the unconditional per-round rates."""
    out, prev = [], 1.0
    for p in acc:
        out.append(p / prev if prev > 0 else 0.0)
        prev = p
    return out


def train_facts(out_dir: Path) -> dict:
    summ = json.loads((out_dir / "train_summary.json").read_text())
    return {"steps": summ["step"], "token_passes": summ["tokens_seen"], "train_tokens": summ["tokens"],
            "train_seconds": summ["train_seconds"], "train_tokens_per_s": summ["tokens_per_s"],
            "heldout_top1": summ["eval_acc"], "heldout_positions": summ["eval_positions"]}


def arm_result(work: Path, a: Arm, costs: dict) -> dict:
    out = Path(a.summary).parent if a.summary else work / "arms" / a.name / "out"
    cfg = json.loads((head_dir(work, a) / "config.json").read_text())
    res = {"arm": a.name, "change": a.change, "data": a.data, "flags": " ".join(a.flags),
           "head_params": _head_params(head_dir(work, a)), "draft_vocab": cfg.get("draft_vocab_size"),
           "mtbench_coverage": coverage(head_dir(work, a), greedy_tokens(work)),
           **train_facts(out), "engine": {}, "predicted_b1": {}}
    for d in a.chains:
        acc = engine_acceptance(work / "arms" / a.name / "bench", d)
        if acc:
            res["engine"][f"chain{d}"] = acc
    deepest = []  # the deepest measured chain's per-depth acceptance predicts every shallower chain
    if res["engine"]:
        deepest = res["engine"][f"chain{max(int(k[5:]) for k in res['engine'])}"]["acceptance_by_depth"]
    res["predicted_b1"] = prediction(costs, a, deepest)
    if (work / "arms" / a.name / "COST_ONLY").is_file():
        res["cost_only"] = True
        res["change"] += " [cost only: 1 step, not trained]"
    return res


def prediction(costs: dict, a: Arm, acceptance: list[float]) -> dict:
    """Per timed chain depth d: draft ms, verify ms, expected tokens per round from the measured acceptance,
    the break-even tokens per round (step / plain step) and ``costmodel.predicted_speedup`` at batch 1."""
    from eaglespec.spec.costmodel import CostTable, chain_expected_tokens, predicted_speedup

    verify = {(1, int(n)): s for n, s in costs["verify_s"].items()}
    out = {}
    for d_text, draft_s in sorted(costs["draft_s"].get(a.name, {}).items(), key=lambda kv: int(kv[0])):
        d = int(d_text)
        table = CostTable(verify, {(1, f"chain{d}"): draft_s})
        v1, vn = table.verify_cost(1, 1), table.verify_cost(1, d + 1)
        p = out[f"chain{d}"] = {"draft_ms": round(1e3 * draft_s, 3), "verify1_ms": round(1e3 * v1, 3),
                                f"verify{d + 1}_ms": round(1e3 * vn, 3),
                                "break_even_tokens": round((draft_s + vn) / v1, 4)}
        if d <= len(acceptance):
            e = chain_expected_tokens(conditional(acceptance), d)
            p["expected_tokens"] = round(e, 4)
            p["predicted_speedup"] = round(predicted_speedup(table, 1, f"chain{d}", d + 1, e), 4)
    return out


def _head_params(directory: Path) -> int:
    """Trainable parameters of a saved head (the d2t / t2d index maps excluded)."""
    from safetensors import safe_open

    n = 0
    for f in directory.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            for k in st.keys():
                if k not in ("d2t", "t2d"):
                    n += math.prod(st.get_slice(k).get_shape())
    return n


def table_md(rows: list[dict]) -> str:
    cols = ["arm", "change", "steps", "token-passes", "held-out top-1 per TTT step", "MT-bench coverage",
            "tau (chain 3)",
            "acceptance d1 / d2 / d3", "d1 - baseline [95% CI]", "draft ms chain 1 / 3 (b=1)", "break-even tokens/round chain 1 / 3 (chain 1: d1 needed + 1)",
            "predicted speedup b=1 chain 1 / 3"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        c = r["engine"].get("chain3", {})
        p1, p3 = r["predicted_b1"].get("chain1", {}), r["predicted_b1"].get("chain3", {})

        def pair(key: str, fmt: str) -> str:
            return " / ".join(format(p[key], fmt) if key in p else "-" for p in (p1, p3))

        lines.append(" | ".join([
            f"| {r['arm']}", r["change"], str(r["steps"]), f"{r['token_passes']:,}" if not r.get("cost_only") else "-",
            "-" if r.get("cost_only") else " / ".join(f"{x:.3f}" for x in r["heldout_top1"]),
            "-" if r.get("mtbench_coverage") is None else f"{r['mtbench_coverage']:.3f}",
            f"{c['tau']:.3f}" if c else "-",
            " / ".join(f"{x:.3f}" for x in c.get("acceptance_by_depth", [])) or "-", _delta(r.get("d1_vs_baseline")),
            pair("draft_ms", ".2f"), pair("break_even_tokens", ".3f"), pair("predicted_speedup", ".3f")]) + " |")
        for key, e in r["engine"].items():
            if key == "chain3":
                continue
            p = r["predicted_b1"].get(key, {})
            lines.append(" | ".join([f"| {r['arm']} ({key})", f"the same head drafting a {key}", "", "", "", "",
                                     f"{e['tau']:.3f} ({key})", " / ".join(f"{x:.3f}" for x in e["acceptance_by_depth"]), "",
                                     f"{p.get('draft_ms', float('nan')):.2f}", f"{p.get('break_even_tokens', float('nan')):.3f}",
                                     f"{p.get('predicted_speedup', float('nan')):.3f}"]) + " |")
    return "\n".join(lines) + "\n"


def _delta(d: dict | None) -> str:
    return "-" if not d else f"{d['delta']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"


def cmd_collect(args: argparse.Namespace) -> int:
    import datetime
    import platform

    import torch

    work, out = Path(args.work), Path(args.out)
    costs = json.loads(Path(args.costs).read_text())
    cpu = costs["machine"].split(" | ")[0]
    rows = []
    for a in finished(work):
        r = arm_result(work, a, costs)
        r.update({"cpu": cpu, "machine": costs["machine"], "torch": torch.__version__, "python": platform.python_version(),
                  "date": datetime.date.today().isoformat()})
        rows.append(r)
    base = next((r["engine"].get("chain3") for r in rows if r["arm"] == "baseline"), None)
    for r in rows:
        c = r["engine"].get("chain3")
        if base and c and r["arm"] != "baseline":
            r["d1_vs_baseline"] = paired_delta_d1(c, base)
    for r in rows:  # the per-prompt counts served the bootstrap; records.jsonl under bench/ keeps them
        for e in r["engine"].values():
            e.pop("per_prompt_d1", None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "costs.json").write_text(json.dumps(costs, indent=1))
    (out / "table.md").write_text(table_md(rows))
    print(table_md(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("arms").set_defaults(func=cmd_arms)
    c = sub.add_parser("cost")
    c.add_argument("--work", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--rounds", type=int, default=7)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--model", default=None)
    c.add_argument("--force", action="store_true", help="measure again even if --out covers every finished arm")
    c.set_defaults(func=cmd_cost)
    k = sub.add_parser("collect")
    k.add_argument("--work", required=True)
    k.add_argument("--costs", required=True)
    k.add_argument("--out", required=True)
    k.set_defaults(func=cmd_collect)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
