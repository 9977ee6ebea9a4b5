"""`eaglespec diagnose`: why does a draft head accept what it accepts? Acceptance, tau and feature drift.

Two measurements on the same prompts (first turns of `--dataset`):

1. Real decoding (the engine, greedy, a chain of `--steps` drafts): per-position acceptance (fraction of
   rounds in which the depth-d draft was accepted) and tau per category.
2. Teacher forcing: the target runs over prompt + its own greedy answer; then, from every answer position
   m, the head drafts k steps exactly as in decoding (its draft cache holds the true pairs before m; step
   j >= 2 feeds back the head's own output of step j-1) but with the TRUE next tokens, so every step can be
   compared with what the target really computed there:
     cos_target  cosine(head output of step j, the target's true feature at that position); for EAGLE-1
                 the final-normed hidden state (what the head is trained to predict), for EAGLE-3 the fused
                 feature fc(low|mid|high) that the head takes as input there;
     cos_teacher cosine(head output of step j, the head's output at the same position from TRUE features):
                 how far feeding back its own predictions moves it (1.0 at step 1 by definition);
     top1        the step-j draft token equals the target's greedy token (an upper bound of the conditional
                 acceptance at depth j given depths < j accepted).
   cos_target is also broken down by answer position (0-31, 32-63, 64-127, 128+).

Verdict (docs/BENCHMARKS.md: cosine below ~0.9 means retrain): the first step whose cosine falls below
0.9 (cos_target for EAGLE-1 heads; cos_teacher for EAGLE-3 heads, which are trained on tokens, not on
features), a step-1 top-1 agreement that is low, and a real-path acceptance far below the teacher-forced
agreement (a drafting/alignment problem rather than a training one).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

log = logging.getLogger("eaglespec")

COSINE_RETRAIN = 0.9  # docs/BENCHMARKS.md, "diagnose"
LOW_TOP1 = 0.3  # step-1 agreement below this: the head barely predicts the next token at all
PATH_GAP = 0.15  # real acceptance this far below teacher-forced agreement: drafting differs from training
POSITION_BUCKETS = ((0, 32), (32, 64), (64, 128), (128, None))


@dataclass
class StepStats:
    """Sums over teacher-forced positions for one unroll step."""

    n: int = 0
    cos_target: float = 0.0
    cos_teacher: float = 0.0
    top1: int = 0
    by_bucket: dict = field(default_factory=lambda: defaultdict(lambda: [0.0, 0]))  # bucket -> [sum cos, n]

    def summary(self) -> dict:
        n = max(self.n, 1)
        buckets = {f"{lo}-{hi - 1 if hi else ''}": round(s / c, 4) for (lo, hi), (s, c) in self.by_bucket.items() if c}
        return {"positions": self.n, "cos_target": round(self.cos_target / n, 4),
                "cos_teacher": round(self.cos_teacher / n, 4), "top1": round(self.top1 / n, 4),
                "cos_target_by_answer_position": buckets}


def teacher_forced_unroll(target, head, tokens: list[int], prompt_len: int, steps: int,
                          stats: list[StepStats], chunk: int = 64) -> None:
    """Add one sequence's per-step comparisons to `stats` (module docstring, step 2).

    Alignment (proposer.py): pair i = (f_i, t_{i+1}) at position i; its output o_i predicts f_{i+1} and token
    t_{i+2}. Drafting from pending token t_m starts from o_{m-1} (step 1); step j >= 2 runs the pair
    (step j-1's output, t_{m+j-1}) at position m+j-2, seeing the true pairs 0..m-1 and its earlier steps.
    """
    device = target.model.device
    n = len(tokens)
    ids = torch.tensor([tokens], device=device)
    cache = target.model.new_cache(1, n)
    out = target.model(ids, torch.arange(n, device=device)[None], cache, hidden_indices=head.hidden_indices)
    feats = head.target_feature(out).to(head.dtype)  # [1, n, F]
    true = out.hidden.to(head.dtype) if head.config.kind == "eagle1" else head.fuse(feats)  # [1, n, H]
    hcache = head.new_cache(1, n)
    o1 = head(head.fuse(feats[:, : n - 1]), ids[:, 1:], torch.arange(n - 1, device=device)[None], hcache)[0]
    hcache.advance(torch.zeros(1, dtype=torch.long, device=device), torch.tensor([n - 1], device=device))
    # starts m: the pending token t_m is an answer token and t_{m+steps} exists
    starts = list(range(max(prompt_len, 1), n - steps))
    for c0 in range(0, len(starts), chunk):
        m = torch.tensor(starts[c0 : c0 + chunk], device=device)  # [R]
        R = m.numel()
        rows = torch.arange(R, device=device)
        rc = head.new_cache(R, n + steps)
        rc.k[:, :, :, : n - 1] = hcache.k[:, :1, :, : n - 1]
        rc.v[:, :, :, : n - 1] = hcache.v[:, :1, :, : n - 1]
        rc.lengths[:] = m  # pairs 0..m-1 committed
        h = o1[m - 1][:, None]  # [R, 1, H] step 1 = o_{m-1}
        for j in range(1, steps + 1):
            if j > 1:
                mask = torch.ones(R, 1, j - 1, dtype=torch.bool, device=device)
                h = head(h, ids[0, m + j - 1][:, None], (m + j - 2)[:, None], rc, rows=rows, block_mask=mask)
            pos = m + j - 1  # step j's output predicts the feature of position m+j-1 and the token t_{m+j}
            cos_t = F.cosine_similarity(h[:, 0].float(), true[0, pos].float(), dim=-1)  # [R]
            cos_s = F.cosine_similarity(h[:, 0].float(), o1[pos - 1].float(), dim=-1)
            draft = head.to_target_ids(head.logits(h[:, 0]).argmax(-1))
            st = stats[j - 1]
            st.n += R
            st.cos_target += float(cos_t.sum())
            st.cos_teacher += float(cos_s.sum())
            st.top1 += int((draft == ids[0, m + j]).sum())
            for g, c in zip((m - prompt_len).tolist(), cos_t.tolist()):
                b = next(bk for bk in POSITION_BUCKETS if g >= bk[0] and (bk[1] is None or g < bk[1]))
                st.by_bucket[b][0] += c
                st.by_bucket[b][1] += 1


def verdict(kind: str, steps: list[dict], acceptance: list[float]) -> list[str]:
    """Plain-language findings from the per-step summaries and the real-path acceptance."""
    key = "cos_target" if kind == "eagle1" else "cos_teacher"
    what = "the target's true features" if kind == "eagle1" else "its own output from true features"
    notes = []
    low = next((j for j, s in enumerate(steps, 1) if s[key] < COSINE_RETRAIN), None)
    if low == 1:
        notes.append(f"step-1 features already diverge (cosine {steps[0][key]:.2f} < {COSINE_RETRAIN}) from {what}: "
                     f"the head does not reproduce the target even from true inputs: retrain it (and check that "
                     f"it was trained for this target and these feature layers)")
    elif low is not None:
        notes.append(f"features diverge from step {low} (cosine {steps[low - 1][key]:.2f} < {COSINE_RETRAIN} vs "
                     f"{what}): the head drifts when fed its own predictions: retrain with more training-time-test "
                     f"steps (>= {low}) or more data, or draft at most {low - 1} deep")
    else:
        notes.append(f"features hold for all {len(steps)} steps (cosine >= {COSINE_RETRAIN} vs {what})")
    if steps and steps[0]["top1"] < LOW_TOP1:
        notes.append(f"step-1 top-1 agreement is only {steps[0]['top1']:.2f}: the head rarely predicts the target's "
                     f"next token: retrain (more/regenerated data, more steps)")
    if acceptance and steps and steps[0]["top1"] - acceptance[0] > PATH_GAP:
        notes.append(f"real decoding accepts depth 1 in {acceptance[0]:.2f} of rounds but teacher forcing predicts "
                     f"{steps[0]['top1']:.2f}: the drafting path differs from training (draft-KV alignment, "
                     f"feature layers, tokenizer/chat template): check the proposer, not the weights")
    return notes


def diagnose(target, head_dir: str, questions, steps: int = 5, max_new_tokens: int = 128,
             chat: bool = True) -> dict:
    """Run both measurements of the module docstring; returns a JSON-able summary with `verdict` lines."""
    from eaglespec.config import GenerationConfig
    from eaglespec.datasets import encode_conversation
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.measure.report import acceptance_by_position, tau
    from eaglespec.spec.speculative import DraftOptions, build_proposer
    from eaglespec.spec.strategies import Chain

    proposer = build_proposer(target, DraftOptions(draft=head_dir, tree=Chain.kind, depth=steps))
    head = proposer.head
    engine = Engine(target, proposer=proposer)
    stats = [StepStats() for _ in range(steps)]
    records = []
    with torch.inference_mode():
        for q in questions:
            prompt = encode_conversation(target.tokenizer, q.turns[:1], [], chat=chat)
            c = engine.generate([Request(prompt, GenerationConfig(max_new_tokens))])[0]
            st = c.stats
            records.append({"category": q.category, "new_tokens": st.new_tokens, "target_forwards": st.target_forwards,
                            "accepted_per_position": st.accepted_per_position, "tree_depth": steps})
            teacher_forced_unroll(target, head, prompt + c.token_ids, len(prompt), steps, stats)
            log.info("%s %s: %d tokens, tau %.2f", q.dataset, q.question_id, st.new_tokens, st.tau)
    summaries = [s.summary() for s in stats]
    by_cat = defaultdict(list)
    for r in records:
        by_cat[r["category"] or "(none)"].append(r)
    acceptance = acceptance_by_position(records)
    return {"head": str(head_dir), "kind": head.config.kind, "prompts": len(records),
            "acceptance_by_position": [round(a, 4) for a in acceptance], "tau": round(tau(records) or 0.0, 4),
            "tau_by_category": {k: round(tau(v) or 0.0, 4) for k, v in by_cat.items()},
            "steps": summaries, "verdict": verdict(head.config.kind, summaries, acceptance)}


def format_summary(d: dict) -> str:
    acceptance = " ".join(f"d{i}={a:.2f}" for i, a in enumerate(d["acceptance_by_position"], 1))
    taus = ", ".join(f"{k} {v:.2f}" for k, v in d["tau_by_category"].items())
    lines = [f"head {d['head']} ({d['kind']}), {d['prompts']} prompts", "",
             f"real decoding (greedy, chain of {len(d['steps'])}):",
             f"  acceptance by depth: {acceptance}",
             f"  tau: {d['tau']:.2f}; by category: {taus}",
             "", "teacher-forced unroll (cosine of predicted vs true features, top-1 agreement):",
             "  step | positions | cos_target | cos_teacher | top1 | cos_target by answer position"]
    for j, s in enumerate(d["steps"], 1):
        buckets = ", ".join(f"{k}: {v:.2f}" for k, v in s["cos_target_by_answer_position"].items())
        lines.append(f"  {j:>4} | {s['positions']:>9} | {s['cos_target']:>10.3f} | {s['cos_teacher']:>11.3f} | "
                     f"{s['top1']:.2f} | {buckets}")
    lines += ["", "verdict:"] + [f"  - {v}" for v in d["verdict"]]
    return "\n".join(lines)


def register(subparsers) -> None:
    from eaglespec.flags import add_model_args

    p = subparsers.add_parser("diagnose", help="per-position acceptance, tau per category and feature drift of a head",
                              description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--draft", required=True, metavar="DIR", help="EAGLE head directory")
    p.add_argument("--dataset", required=True, metavar="[NAME=]PATH", help="question file (first turns are used)")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--categories", default=None, help="comma list of categories to keep")
    p.add_argument("--steps", type=int, default=5, help="draft steps k (chain depth and unroll length)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the summary as JSON")
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from eaglespec.datasets import load_questions
    from eaglespec.runtime.loading import load_target

    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    questions = load_questions(args.dataset, args.limit, args.categories.split(",") if args.categories else None)
    target = load_target(args.model, dtype=args.dtype, device=args.device, compile=args.compile,
                         int4_kernel=args.int4_kernel,
                         prompt_dtype=args.prompt_dtype, kv_dtype=args.kv_dtype)
    d = diagnose(target, args.draft, questions, args.steps, args.max_new_tokens, chat=not args.raw)
    print(format_summary(d))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(d, f, indent=2)
    return 0
