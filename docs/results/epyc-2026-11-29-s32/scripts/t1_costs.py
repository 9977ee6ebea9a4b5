# Where `--tree auto` spends its time, against vanilla, in one process (arms rotating per group,
# eaglespec.measure.ab): every decode step's wall time (the engine's whole step, its tokens' bookkeeping included;
# vanilla's too) by what the step did (plain, a look-back that caught the draft cache up, drafting that caught up
# first, drafting), the catch-ups' own seconds and pairs, and the tokens the drafting rounds committed.
# Since session 33 it also prints each auto arm's price checks at the end (StepCostFeedback's snapshot).
# python t1_costs.py QUESTIONS PER_CATEGORY TEMPERATURE PASSES ARM...
# ARM: vanilla | chain<D> | auto | auto:ATTR=VALUE,... (``eaglespec.measure.ab.arm_engine``; the rule before
# session 32: auto:spread_probes=False)
import collections
import sys
import time

import torch

from eaglespec.measure.ab import arm_engine, first_turn_requests, rotate_arms
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target

allocator.tune(); torch.set_num_threads(2)
print("cpu:", cpu_kernels.cpuinfo("model name"), "| torch", torch.__version__)
path, per_cat, temp, passes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
target = load_target(None)
reqs = first_turn_requests(target.tokenizer, path, per_cat, temp)


class Tally:
    """Wraps a proposer's catch-up, propose, step timing and the dispatcher's observe to count where time goes."""

    def __init__(self, engine, prop):
        self.kinds = collections.defaultdict(lambda: [0, 0.0])  # step kind -> [steps, seconds]
        self.catch = collections.defaultdict(lambda: [0, 0.0, 0])  # look-back / resume -> [calls, seconds, pairs]
        self.rounds = [0, 0]  # drafting rounds observed, draft tokens accepted in them
        self.label, self.caught = "vanilla", None
        step = engine._step

        def step_(seqs):
            t0 = time.perf_counter()
            chunks = step(seqs)
            dt = time.perf_counter() - t0
            kind = self.label if self.label in ("vanilla", "none") else "draft"
            kind += "+" + self.caught if self.caught else ""
            self.kinds[kind][0] += 1; self.kinds[kind][1] += dt
            return chunks

        engine._step = step_
        if prop is None:
            return
        catch_up, propose, observe = prop._catch_up, prop.propose, getattr(prop.dispatcher, "observe", None)

        def catch_up_(rows, row_ids=None, look_back=False):
            pairs = prop.catch_up_pairs(list(row_ids) if row_ids is not None else rows.tolist())
            t0 = time.perf_counter()
            catch_up(rows, row_ids, look_back)
            self.caught = "look-back" if look_back else "resume"
            c = self.catch[self.caught]
            c[0] += 1; c[1] += time.perf_counter() - t0; c[2] += pairs

        def propose_(*a, **k):
            self.caught = None
            tree = propose(*a, **k)
            self.label = prop.step_label
            return tree

        def observe_(rows, cfg, n_accepted):
            if cfg.drafts:
                self.rounds[0] += len(n_accepted); self.rounds[1] += sum(n_accepted)
            observe(rows, cfg, n_accepted)

        prop._catch_up, prop.propose = catch_up_, propose_
        if observe is not None:  # a fixed tree's dispatcher observes nothing
            prop.dispatcher.observe = observe_


arms = {spec: arm_engine(target, spec, 1) for spec in sys.argv[5:]}
tallies = {spec: Tally(engine, engine.proposer) for spec, engine in arms.items()}
with torch.inference_mode():
    tot = rotate_arms(arms, reqs, 1, passes)
base = tot["vanilla"]
print(f"{len(reqs)} requests of {min(len(r.prompt_ids) for r in reqs)}-{max(len(r.prompt_ids) for r in reqs)} tokens, "
      f"batch 1, T={temp}, {passes} passes (the first group a warm-up; the step counts below include it)")
for name, t in tot.items():
    print(f"{name:34s} wall {t.tokens / t.wall_s:7.1f} tok/s ({base.wall_s / t.wall_s:.3f}x)  decode "
          f"{t.tokens / t.decode_s:7.1f} ({base.decode_s / t.decode_s:.3f}x)  rounds {dict(t.rounds)}")
for name, tl in tallies.items():
    print(f"--- {name}")
    for k, (n, s) in sorted(tl.kinds.items()):
        print(f"  steps {k:20s} {n:6d}  {1e3 * s:9.1f} ms  {1e3 * s / n:6.3f} ms a step")
    n, a = tl.rounds
    print(f"  drafting rounds {n}: {(n + a) / max(1, n):.3f} tokens a round")
    for k, (n, s, p) in sorted(tl.catch.items()):
        print(f"  catch-ups {k:10s} {n:5d} calls  {1e3 * s:8.1f} ms  {p:7d} pairs  ({1e6 * s / max(p, 1):.1f} us a pair)")
    feedback = getattr(getattr(arms[name].proposer, "dispatcher", None), "feedback", None)
    for e in feedback.snapshot() if feedback is not None else []:  # measured / priced seconds, by tree and band
        print(f"  price check {e['tree']:8s} context {e['context']}: ratio {e['ratio']:.3f} over {e['weight']:6.1f} "
              f"steps, factor {e['factor']:.3f}")
