"""`eaglespec` command line: `eaglespec generate ...`, `eaglespec calibrate`.

Results go to stdout (text, or one JSON object per prompt with --json); progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from eaglespec.config import ConfigError, GenerationConfig, SamplingParams
from eaglespec.flags import add_draft_args, add_model_args, draft_options, draft_temperature

log = logging.getLogger("eaglespec")


class CLIError(Exception):
    """A user error: printed as `eaglespec: error: ...` without a traceback."""


def read_prompts_file(path: str) -> list[str]:
    """Prompts from a file: MT-bench style records (`turns`: the first turn is used), a `prompt` field, or any
    other format `eaglespec.datasets` reads (HumanEval, GSM8K `question`, Alpaca `instruction`)."""
    from eaglespec.datasets import load_questions

    return [q.turns[0] for q in load_questions(path)]


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of a prompt: as a user turn through the model's chat template, or raw text."""
    from eaglespec.datasets import encode_conversation

    if not text.strip():
        raise CLIError("empty prompt: give some text")
    try:
        return encode_conversation(tokenizer, [text], [], chat=chat)
    except ValueError as e:
        raise CLIError(str(e)) from None


def _add_generate_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts-file", help="JSONL with `turns` (first turn used) or `prompt` per record")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template to prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS (fixed-length benchmarks)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts decoded together")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    add_draft_args(p)
    p.add_argument("--no-warmup", action="store_true", help="skip the unreported warm-up run")



def _completion_record(c, prompt: str) -> dict:
    st = c.stats
    return {
        "index": c.index,
        "prompt": prompt,
        "text": c.text,
        "token_ids": c.token_ids,
        "prompt_tokens": st.prompt_tokens,
        "new_tokens": st.new_tokens,
        "finish_reason": c.finish_reason,
        "target_forwards": st.target_forwards,
        "tau": round(st.tau, 4),
        "accepted_per_position": st.accepted_per_position,
        "prefill_s": round(st.prefill_s, 6),
        "draft_s": round(st.draft_s, 6),
        "verify_s": round(st.verify_s, 6),
        "wall_s": round(st.wall_s, 6),
        "tokens_per_s": round(st.new_tokens / st.wall_s, 3) if st.wall_s > 0 else None,
        **st.dispatch_record(),
    }


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from eaglespec.engine.generate import Engine, Request
    from eaglespec.runtime.loading import load_target
    from eaglespec.engine.calibrate import build_calibrated_proposer as build_proposer

    prompts = list(args.prompt)
    if args.prompts_file:
        prompts += read_prompts_file(args.prompts_file)
    if not prompts:
        raise CLIError("no prompts: pass --prompt TEXT (repeatable) or --prompts-file FILE.jsonl")
    if args.max_new_tokens < 1:
        raise CLIError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be >= 1, got {args.batch_size}")
    try:
        sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
        cfg = GenerationConfig(args.max_new_tokens, sampling, tuple(args.stop), args.ignore_eos)
    except ConfigError as e:
        raise CLIError(str(e)) from None

    t0 = time.perf_counter()
    target = load_target(args.model, dtype=args.dtype, device=args.device, compile=args.compile,
                         int4_kernel=args.int4_kernel,
                         prompt_dtype=args.prompt_dtype, kv_dtype=args.kv_dtype)
    log.info("loaded %s (%s, %s) in %.1f s", target.name, target.model.precision, args.device, time.perf_counter() - t0)
    ids = [encode_prompt(target.tokenizer, p, chat=not args.raw) for p in prompts]
    proposer = build_proposer(target, draft_options(args))
    if proposer is not None:
        log.info("speculative decoding with %s, trees %s", args.draft or "the shipped head", proposer.dispatcher)
    engine = Engine(target, proposer=proposer, max_batch_size=args.batch_size)
    requests = [Request(x, cfg) for x in ids]
    with torch.inference_mode():
        if not args.no_warmup:
            warm = GenerationConfig(min(8, cfg.max_new_tokens), sampling, (), True)
            engine.generate([Request(ids[0], warm)] * min(args.batch_size, len(ids)))
        if args.json:
            for c in engine.generate(requests):
                print(json.dumps(_completion_record(c, prompts[c.index]), ensure_ascii=False), flush=True)
        elif len(requests) == 1:
            for chunks in engine.stream(requests):
                for ch in chunks:
                    sys.stdout.write(ch.text)
                    sys.stdout.flush()
            sys.stdout.write("\n")
        else:
            for c in engine.generate(requests):
                print(f"=== [{c.index}] {prompts[c.index]!r}\n{c.text}\n", flush=True)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure (or load) this machine's speculation costs for the target and head; print the table."""
    import torch

    from eaglespec.engine.calibrate import calibration_candidates, calibration_for, cost_table_text
    from eaglespec.runtime.loading import cache_root, load_target
    from eaglespec.spec.speculative import load_draft_head, resolve_head_dir

    if args.threads is not None:
        if args.threads < 1:
            raise CLIError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    opts = draft_options(args)
    target = load_target(args.model, dtype=args.dtype, device=args.device, compile=args.compile,
                         int4_kernel=args.int4_kernel,
                         prompt_dtype=args.prompt_dtype, kv_dtype=args.kv_dtype)
    head_dir = resolve_head_dir(opts, target)
    if head_dir is None:
        raise CLIError("no draft head to calibrate: give one with --draft DIR (the default model's head is "
                       "shipped; other models need their own)")
    head = load_draft_head(head_dir, target)
    t0 = time.perf_counter()
    with torch.inference_mode():
        costs, measured = calibration_for(target, head, head_dir, opts, recalibrate=args.force)
    how = f"measured now in {time.perf_counter() - t0:.1f} s" if measured else "cached (--force measures again)"
    kv = str(target.model.kv_dtype).removeprefix("torch.")
    print(f"calibration of {target.name} ({target.model.precision}, {kv} KV cache, {torch.get_num_threads()} threads) "
          f"with the head {head_dir}: {how}; cache {cache_root() / 'calibration'}")
    print(cost_table_text(costs, calibration_candidates(opts)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eaglespec", description="EAGLE speculative decoding")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for prompts")
    _add_generate_args(g)
    g.set_defaults(func=cmd_generate)
    c = sub.add_parser("calibrate", help="measure this machine's speculation costs (cached) and print them",
                       description="Measure the target's verify cost per batch size and tokens and the draft cost "
                                   "of every candidate tree (docs/DISPATCH.md); cached per machine, model, "
                                   "precision and head, and used by --tree auto.")
    add_model_args(c)
    c.add_argument("--draft", default=None, help="EAGLE head directory (default: the shipped head)")
    c.add_argument("--draft-temperature", type=draft_temperature, default=None, metavar="T|request",
                   help="> 0: calibrate the candidates of draft sampling at that fixed temperature (chain/static "
                        "trees only); default: each request's own, every candidate")
    c.add_argument("--draft-alignment", default="stable", choices=["stable", "last"])
    c.add_argument("--threads", type=int, default=None, help="torch CPU threads (part of the machine key)")
    c.add_argument("--force", action="store_true", help="measure again even when a cached calibration exists")
    c.set_defaults(func=cmd_calibrate, tree="auto", depth=None, topk=None, tree_tokens=None, tree_paths=None,
                   seed=None)
    __import__("eaglespec.train.cli", fromlist=["register"]).register(sub)
    __import__("eaglespec.measure.bench", fromlist=["register"]).register(sub)
    __import__("eaglespec.measure.report", fromlist=["register"]).register(sub)
    __import__("eaglespec.measure.diagnose", fromlist=["register"]).register(sub)
    __import__("eaglespec.measure.fidelity", fromlist=["register"]).register(sub)
    __import__("eaglespec.measure.interop", fromlist=["register"]).register(sub)
    __import__("eaglespec.serve.cli", fromlist=["register"]).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(name)s: %(message)s")
    from eaglespec.runtime import allocator

    allocator.tune()  # before any model is loaded: see runtime/allocator.py
    try:
        return args.func(args)
    except CLIError as e:
        parser.exit(2, f"eaglespec: error: {e}\n")
    except (ValueError, FileNotFoundError) as e:
        parser.exit(2, f"eaglespec: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())
