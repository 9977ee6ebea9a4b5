# The draft cache's catch-ups of `--tree auto` at batch 4 (this machine's calibration): every catch-up of a fresh
# proposer's first pass over MT-bench first turns (3 a category, 24 prompts, 128 tokens, T=0) with the rows' waiting
# prompt pairs, the pause's bound, the pairs its head forwards encoded (padding included) and its wall time; then
# PASSES passes of `--draft none` and `--tree auto` in turns (one engine each, after a warm-up group; another fresh
# proposer), with their catch-ups (as above), their total and auto's rounds by tree.
# Usage: catch_ups.py MT_BENCH_JSONL [PASSES]
import collections, sys, time

import torch

from eaglespec.config import GenerationConfig
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions

allocator.tune()
torch.set_num_threads(2)
target = load_target(None)
prompts = [encode_messages(target.tokenizer, [{"role": "user", "content": q.turns[0]}])
           for q in load_questions(sys.argv[1], per_category=3)]
passes = int(sys.argv[2]) if len(sys.argv) > 2 else 4
reqs = [Request(x, GenerationConfig(128, ignore_eos=True)) for x in prompts]
log, spent = [], collections.Counter()


def traced():
    """A fresh `--tree auto` proposer whose catch-ups are timed and logged."""
    p = build_calibrated_proposer(target, DraftOptions())
    encoded = []  # pairs of each head forward of the current catch-up
    encode, catch_up = p._encode, p._catch_up
    p._encode = lambda rows, feats, *a: encoded.append(feats.shape[0] * feats.shape[1]) or encode(rows, feats, *a)

    def timed_catch_up(rows, ids=None, look_back=False):
        ids_ = list(ids) if ids is not None else rows.tolist()
        waiting = [p._prompts[r][1].shape[0] if r in p._prompts else 0 for r in ids_]
        bound = p._lag_bound
        encoded.clear()
        t0 = time.perf_counter()
        catch_up(rows, ids, look_back)
        dt = time.perf_counter() - t0
        spent["catch_up"] += dt
        spent["calls"] += 1
        log.append(f"rows {len(ids_)} prompts {waiting} bound {bound} look_back {look_back} forwards {len(encoded)} "
                   f"pairs {sum(encoded)} {dt * 1e3:.1f} ms")

    p._catch_up = timed_catch_up
    return p


vanilla, auto = Engine(target, None, max_batch_size=4), Engine(target, traced(), max_batch_size=4)
wall = collections.defaultdict(list)
rounds = []  # auto's rounds by tree (summed over rows), per pass
with torch.inference_mode():
    vanilla.generate(reqs[:4])
    Engine(target, traced(), max_batch_size=4).generate(reqs)  # a fresh proposer's first pass, traced
    print("prompt tokens", [len(x) for x in prompts])
    print("catch-ups of a fresh proposer's first pass:")
    print("\n".join(log))
    log.clear()
    auto.generate(reqs[:4])  # the timed proposer's warm-up group
    spent.clear()
    for i in range(passes):
        turn = (("vanilla", vanilla), ("auto", auto))
        for name, e in (turn if i % 2 == 0 else turn[::-1]):
            t0 = time.perf_counter()
            done = e.generate(reqs)
            wall[name].append(time.perf_counter() - t0)
            if e is auto:
                rounds.append(sum((collections.Counter(c.stats.tree_rounds) for c in done), collections.Counter()))
print(f"{passes} passes each, in turns: vanilla {[round(x, 2) for x in wall['vanilla']]} s, "
      f"auto {[round(x, 2) for x in wall['auto']]} s")
print(f"vanilla / auto per pass: {[round(a / b, 3) for a, b in zip(wall['vanilla'], wall['auto'])]}")
print("auto's rounds by tree per pass:", [dict(r) for r in rounds])
print("auto's catch-ups in its warm-up group and the timed passes (the total below: the timed passes'):")
print("\n".join(log))
print(f"auto's catch-ups: {spent['calls']} in {spent['catch_up'] * 1e3:.0f} ms, "
      f"{spent['catch_up'] / sum(wall['auto']) * 100:.2f}% of auto's time")
