# Shared by this directory's "where does a step go" scripts: time the target's decode and verification forwards
# (not prompts) into timers.acc / timers.cnt under "target.fwd".
import time

from timers import acc, cnt


def time_decode_forwards(model) -> None:
    forward = model.forward

    def timed(tokens, *a, **k):
        t0 = time.perf_counter()
        r = forward(tokens, *a, **k)
        if not k.get("prefill"):
            acc["target.fwd"] += time.perf_counter() - t0
            cnt["target.fwd"] += 1
        return r

    model.forward = timed
