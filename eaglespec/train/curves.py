"""Learning curves of draft-head training runs, read from their ``metrics.jsonl``.

A run's ``metrics.jsonl`` (written by `eaglespec.train.train`) holds two kinds of lines: training logs (``loss``,
``acc`` per TTT step, ``tokens`` seen so far) and evaluations (``eval_acc`` per TTT step on the held-out records
and, when acceptance prompts are set, ``tau`` and ``acceptance_by_position`` measured through the engine).
`learning_curve` extracts the evaluation points against training tokens; `plot_learning_curves` draws one or
several runs (ablations) into a PNG: held-out depth-1 accuracy on the left, measured tau on the right.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CurvePoint", "learning_curve", "plot_learning_curves"]


@dataclass(frozen=True)
class CurvePoint:
    step: int
    tokens: int | None  # training tokens seen at this evaluation (None: a run from before tokens were logged)
    eval_acc: tuple[float, ...]  # held-out top-1 accuracy per TTT step
    tau: float | None  # mean acceptance length through the engine (None: not measured)


def learning_curve(metrics: str | Path) -> list[CurvePoint]:
    """The evaluation points of one run, in step order. A malformed line is an error naming the line."""
    path = Path(metrics)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics.jsonl (give a training out_dir or its metrics.jsonl)")
    points = []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        if "eval_acc" not in entry:
            continue
        points.append(CurvePoint(step=int(entry["step"]), tokens=entry.get("tokens"),
                                 eval_acc=tuple(float(a) for a in entry["eval_acc"]), tau=entry.get("tau")))
    if not points:
        raise ValueError(f"{path}: no evaluation lines (train with eval_every > 0 or eval_records > 0)")
    return sorted(points, key=lambda p: p.step)


def plot_learning_curves(runs: dict[str, str | Path], out: str | Path, title: str = "") -> Path:
    """Plot held-out depth-1 accuracy and measured tau against training tokens, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_tau) = plt.subplots(1, 2, figsize=(11, 4))
    for label, metrics in runs.items():
        pts = learning_curve(metrics)
        xs = [p.tokens if p.tokens is not None else p.step for p in pts]
        ax_acc.plot([x / 1e6 for x in xs], [p.eval_acc[0] for p in pts], marker="o", label=label)
        taus = [(x, p.tau) for x, p in zip(xs, pts) if p.tau is not None]
        if taus:
            ax_tau.plot([x / 1e6 for x, _ in taus], [t for _, t in taus], marker="o", label=label)
    ax_acc.set(xlabel="training tokens (M)", ylabel="held-out top-1 accuracy, TTT step 1", title="draft accuracy")
    ax_tau.set(xlabel="training tokens (M)", ylabel="tau (engine, greedy chain)", title="measured acceptance")
    for ax in (ax_acc, ax_tau):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
