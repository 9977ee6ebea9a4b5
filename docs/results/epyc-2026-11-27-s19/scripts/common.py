# Copied from docs/results/xeon-2026-11-27-s12/scripts/common.py (the data dir from $D here).
# Shared by this session's scratch A/B scripts: MT-bench first turns as engine requests (through the project's
# own loader and prompt encoder), the engines of each decoding kind, and the in-process A/B of two kernel builds.
import collections, statistics, time
import torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.generate import Engine, Request
from eaglespec.spec.speculative import DraftOptions, build_proposer

MT_BENCH = "mt_bench=" + __import__("os").environ.get("D", "../shared/data") + "/mt_bench/question.jsonl"  # D: the data dir


def mt_bench_requests(tok, n, first=0, per_category=3, tokens=128, temperature=0.0):
    """MT-bench first turns c[first:first + per_category] of each category c, category by category, the first n
    of them (first=3: none of the matrix's), each decoding exactly `tokens` tokens."""
    by_cat = collections.defaultdict(list)
    for q in load_questions(MT_BENCH, max_turns=1):
        by_cat[q.category].append(q)
    qs = [q for c in by_cat.values() for q in c[first:first + per_category]][:n]
    return [Request(encode_messages(tok, [{"role": "user", "content": q.turns[0]}]),
                    GenerationConfig(tokens, ignore_eos=True, sampling=SamplingParams(temperature=temperature, seed=i)))
            for i, q in enumerate(qs)]


def proposer(target, kind):
    """None (vanilla), chainK (chain = chain1), or a tree kind of DraftOptions ("none", ...). "auto" here is the
    static table by batch size (`--no-calibrate`: a chain of 1 at batch 1, no drafting from batch 2), not the
    calibrated dispatcher (``engine.calibrate.build_calibrated_proposer``)."""
    if kind == "vanilla":
        return None
    if kind.startswith("chain"):
        return build_proposer(target, DraftOptions(tree="chain", depth=int(kind[5:] or 1)))
    return build_proposer(target, DraftOptions(tree=kind))


def kernel_ab(target, kinds, batch, reqs, reps, select):
    """Every kind decoded with the "old" and the "new" kernel (``select(name)`` switches), alternating the order
    each round, in inference mode; asserts every kind's tokens are the same in every round; prints tokens/s."""
    engs = {k: Engine(target, proposer(target, k), max_batch_size=batch) for k in kinds}
    res, outs = collections.defaultdict(list), {}
    with torch.inference_mode():
        for e in engs.values():
            for name in ("old", "new"):
                select(name)
                e.generate(reqs[:batch])
        for rep in range(reps):
            for k, e in engs.items():
                for name in (("old", "new") if rep % 2 == 0 else ("new", "old")):
                    select(name)
                    t0 = time.perf_counter()
                    o = e.generate(reqs)
                    dt = time.perf_counter() - t0
                    res[k, name].append(sum(len(x.token_ids) for x in o) / dt)
                    toks = [x.token_ids for x in o]
                    assert outs.setdefault((k, name), toks) == toks
    for k in kinds:
        r = [b / a for a, b in zip(res[k, "old"], res[k, "new"])]
        print(f"{k:8s} old {statistics.median(res[k, 'old']):.1f} new {statistics.median(res[k, 'new']):.1f} tok/s; "
              f"new/old per rep {' '.join(f'{x:.3f}' for x in r)}")
    print("greedy identical old vs new:", all(outs[k, "old"] == outs[k, "new"] for k in kinds),
          "; spec == vanilla:", all(outs[k, "new"] == outs[kinds[0], "new"] for k in kinds))
