# Two (three) identical vanilla engines in one process, alternating: does an engine instance alone change speed?
# Usage: engine_placebo.py T. ``alternate`` is the rounds loop engine_cache_swap.py and paused_probe_ab.py share.
import sys, collections, statistics, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "xeon-2026-11-27-s12" / "scripts"))  # common.py
from common import mt_bench_requests


def alternate(engs, reqs, reps, seen=None):
    """{name: [tokens/s per round]}: every engine decodes ``reqs`` once a round, in order on even rounds and in
    reverse on odd ones; ``seen(name, rep, outputs)`` after each run."""
    res = collections.defaultdict(list)
    for rep in range(reps):
        for k, e in (list(engs.items()) if rep % 2 == 0 else list(engs.items())[::-1]):
            t0 = time.perf_counter(); o = e.generate(reqs); dt = time.perf_counter() - t0
            res[k].append(sum(len(x.token_ids) for x in o) / dt)
            if seen is not None:
                seen(k, rep, o)
    return res


def report(res, base):
    for k, r in res.items():
        print(f"{k} {statistics.median(r):.1f} tok/s; / {base} per rep " +
              " ".join(f"{a / b:.3f}" for a, b in zip(r, res[base])))


if __name__ == "__main__":
    from eaglespec.runtime.loading import load_target
    from eaglespec.engine.generate import Engine
    torch.set_num_threads(2)
    t = load_target()
    T = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    reqs = mt_bench_requests(t.tokenizer, 8, first=3, temperature=T)
    engs = {k: Engine(t, None, max_batch_size=1) for k in ("A", "B", "C")}
    with torch.inference_mode():
        for e in engs.values(): e.generate(reqs[:1])
        report(alternate(engs, reqs, 4), "A")
