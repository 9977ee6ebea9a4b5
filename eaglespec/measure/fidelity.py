"""`eaglespec fidelity`: what a reduced precision costs in answers and in perplexity, against float32.

For each `--dtypes` precision the target (same `--model`) decodes the first turns of `--dataset` greedily for
exactly `--max-new-tokens` tokens (vanilla, EOS ignored, batch 1) and we count how many answers are token for
token the float32 answer and where the others first differ. Then it scores held-out text teacher-forced
(`--ppl-data`: question + reference answer of each record, chat template off, at most `--ppl-max-len`
tokens) and reports the perplexity twice: every forward run with the kernels decoding runs (packed weights use
their packed kernel for every row count), and as one prompt forward (the kernels a prompt runs: packed targets
multiply prompts of more than 16 tokens densely, in float32 or bfloat16, `--prompt-dtype`). A packed precision
may name its prompt dtype, `int4@bfloat16`; without one it runs what `--prompt-dtype auto` picks here. Any
precision may end in its KV cache's dtype, `int4/float32` or `int4@bfloat16/float16`; without one it runs what
`--kv-dtype auto` picks (float16 for eager int4 on the CPU, else the model's dtype).

Records (one JSON line per precision) go to `--out`; a markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger("eaglespec")

REFERENCE = "float32"


@dataclass
class Fidelity:
    """One precision's result (``identical``/``first_divergence`` are None for the reference itself)."""

    dtype: str
    prompts: int
    max_new_tokens: int
    identical: int | None  # answers equal to float32's, token for token
    mean_first_divergence: float | None  # index of the first differing token, over the answers that differ
    token_agreement: float | None  # fraction of answer tokens before the first difference (cut at max_new_tokens)
    perplexity: float
    ppl_tokens: int
    prompt_perplexity: float  # the same texts scored by one prompt forward each (the prompt path's kernels)
    load_s: float


def greedy_answers(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Vanilla greedy continuations of exactly ``max_new_tokens`` tokens, one request at a time."""
    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request

    cfg = GenerationConfig(max_new_tokens, ignore_eos=True)
    engine = Engine(target, max_batch_size=1)
    with torch.inference_mode():
        return [c.token_ids for c in engine.generate([Request(p, cfg) for p in prompts])]


def perplexity(target, texts: list[list[int]], prefill: bool = False) -> tuple[float, int]:
    """exp(mean next-token NLL) over ``texts`` (token ids), one forward per text; (perplexity, tokens scored).
    ``prefill``: each text as a prompt forward (the prompt path's kernels), else as decoding computes rows."""
    model = target.model
    nll, count = 0.0, 0
    with torch.inference_mode():
        for ids in texts:
            if len(ids) < 2:
                continue
            tokens = torch.tensor([ids], device=model.device)
            positions = torch.arange(len(ids), device=model.device)[None]
            out = model(tokens, positions, model.new_cache(1, len(ids)), logits_at="all", prefill=prefill)
            nll += float(F.cross_entropy(out.logits[0, :-1], tokens[0, 1:], reduction="sum"))
            count += len(ids) - 1
    if count == 0:
        raise ValueError("no perplexity text has two or more tokens")
    return math.exp(nll / count), count


def compare(answers: list[list[int]], reference: list[list[int]]) -> tuple[int, float | None, float]:
    """(identical answers, mean first differing index over the differing ones, token agreement)."""
    firsts = []
    for a, r in zip(answers, reference, strict=True):
        n = min(len(a), len(r))
        first = next((i for i in range(n) if a[i] != r[i]), n if len(a) != len(r) else None)
        firsts.append(first)
    differing = [f for f in firsts if f is not None]
    total = sum(len(r) for r in reference)
    agree = sum(len(r) if f is None else f for f, r in zip(firsts, reference))
    return (len(firsts) - len(differing), sum(differing) / len(differing) if differing else None,
            agree / total if total else 1.0)


def run(args: argparse.Namespace) -> list[Fidelity]:
    from eaglespec.datasets import encode_conversation, load_questions, read_records
    from eaglespec.runtime.loading import KV_DTYPES, load_target
    from eaglespec.runtime.quant import resolve_prompt_dtype

    dtypes = [d.strip().lower() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes:
        raise ValueError("--dtypes is empty")
    dtypes = [REFERENCE] + [d for d in dtypes if d not in (REFERENCE, "fp32")]
    bad = [d for d in dtypes if ":" in d and d.partition(":")[0] != "int4"]
    if bad:
        raise ValueError(f"--dtypes {', '.join(bad)}: only int4 takes a kernel (int4:torch, int4:w4a8)")
    bad = [d for d in dtypes if "@" in d and d.partition("@")[0].partition(":")[0] not in ("int8", "int4")]
    if bad:
        raise ValueError(f"--dtypes {', '.join(bad)}: only packed precisions (int8, int4) take a prompt dtype")
    for d in dtypes:
        if "/" in d and d.partition("/")[2] not in KV_DTYPES[1:]:
            raise ValueError(f"--dtypes {d}: the KV cache dtype after '/' must be one of {', '.join(KV_DTYPES[1:])}")
        if "@" in d:
            resolve_prompt_dtype(d.partition("/")[0].partition("@")[2])
    if args.max_new_tokens < 1 or args.limit < 1 or args.ppl_limit < 1 or args.ppl_max_len < 2:
        raise ValueError("--max-new-tokens, --limit and --ppl-limit must be >= 1 and --ppl-max-len >= 2")
    questions = load_questions(args.dataset, args.limit)
    ppl_records = read_records(args.ppl_data)[: args.ppl_limit]
    if not ppl_records:
        raise ValueError(f"{args.ppl_data}: no records")
    if args.threads:
        torch.set_num_threads(args.threads)

    results: list[Fidelity] = []
    reference: list[list[int]] | None = None
    for dtype in dtypes:
        t0 = time.perf_counter()
        spec, _, kv = dtype.partition("/")  # "int4/float32": the KV cache dtype too
        spec, _, prompt = spec.partition("@")  # "int4@bfloat16": the prompt dtype too
        name, _, kernel = spec.partition(":")  # "int4:torch" / "int4:w4a8": the int4 kernel too
        target = load_target(args.model, dtype=name, device=args.device, int4_kernel=kernel or "auto",
                             prompt_dtype=prompt or "auto", kv_dtype=kv or "auto")
        if name == "int4" and not kernel:
            spec = f"int4:{target.model.int4_kernel}"
        dtype = f"{spec}@{target.model.prompt_dtype}" if name in ("int8", "int4") else spec
        if target.model.kv_dtype != target.model.dtype:
            dtype += "/" + str(target.model.kv_dtype).removeprefix("torch.")
        load_s = time.perf_counter() - t0
        prompts = [encode_conversation(target.tokenizer, q.turns[:1], [], chat=True) for q in questions]
        texts = [target.tokenizer.encode(_ppl_text(r, args.ppl_data))[: args.ppl_max_len] for r in ppl_records]
        answers = greedy_answers(target, prompts, args.max_new_tokens)
        ppl, n_tok = perplexity(target, texts)
        prompt_ppl, _ = perplexity(target, texts, prefill=True)
        if reference is None:
            reference, same = answers, (None, None, None)
        else:
            same = compare(answers, reference)
        results.append(Fidelity(dtype, len(prompts), args.max_new_tokens, same[0], same[1], same[2], ppl, n_tok,
                                prompt_ppl, round(load_s, 1)))
        log.info("fidelity %s: %s", dtype, asdict(results[-1]))
        del target
    return results


def _ppl_text(record: dict, where: str) -> str:
    """Question and reference answer of a held-out record (GSM8K/Alpaca-style keys)."""
    q = record.get("question") or record.get("instruction") or record.get("prompt")
    a = record.get("answer") or record.get("output") or record.get("response") or ""
    if not isinstance(q, str) or not q:
        raise ValueError(f"{where}: a record has no question/instruction/prompt text (keys {sorted(record)})")
    return f"{q}\n{a}" if a else q


def format_table(results: list[Fidelity]) -> str:
    lines = ["| precision | perplexity | perplexity, prompt path | greedy answers identical to float32 | "
             "mean first differing token | tokens before the first difference |", "|---|---|---|---|---|---|"]
    for r in results:
        ppl = f"| {r.dtype} | {r.perplexity:.3f} | {r.prompt_perplexity:.3f} |"
        if r.identical is None:
            lines.append(f"{ppl} (reference) | — | — |")
        else:
            first = f"{r.mean_first_divergence:.1f}" if r.mean_first_divergence is not None else "—"
            lines.append(f"{ppl} {r.identical} / {r.prompts} | {first} | {100 * r.token_agreement:.1f}% |")
    return "\n".join(lines)


def cmd_fidelity(args: argparse.Namespace) -> int:
    results = run(args)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps({**asdict(r), "threads": torch.get_num_threads()}) + "\n")
    print(format_table(results))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("fidelity", help="greedy agreement with float32 and perplexity per precision",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="target: HF dir or .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtypes", default="float32,bfloat16,int8,int4",
                   help="comma list of precisions (float32 is always run, as the reference); int4:torch / int4:w4a8 "
                        "pick the int4 kernel (plain int4: --int4-kernel auto); a packed precision may end in "
                        "@float32 / @bfloat16, the dtype its prompts run in (default: auto, as eaglespec generate); "
                        "any may end in /float32 or /float16, its KV cache's dtype (default: auto, as generate)")
    p.add_argument("--dataset", required=True, metavar="[NAME=]PATH", help="question file (first turns are used)")
    p.add_argument("--limit", type=int, default=10, help="questions")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--ppl-data", required=True, metavar="PATH",
                   help="held-out records (question/answer or instruction/output), e.g. GSM8K test")
    p.add_argument("--ppl-limit", type=int, default=20, help="records scored")
    p.add_argument("--ppl-max-len", type=int, default=512, help="tokens per record")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, metavar="FILE", help="JSONL records, one per precision")
    p.set_defaults(func=cmd_fidelity)
