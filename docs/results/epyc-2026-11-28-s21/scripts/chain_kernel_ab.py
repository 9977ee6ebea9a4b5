# End to end at T=1: vanilla, the chain of 1 and `--tree auto` with this session's two sampled-path kernels on and
# off (eaglespec::verify_chain_sampled: verify._chain_kernel_serves forced False; eaglespec::draft_draw: the
# proposer's cpu_kernels stubbed off; off = the torch rules of 408b142, the sampling kernel still on),
# alternating per request in one process (rotating order), REPS rounds; same tokens either way unless a uniform
# falls within float32 rounding of a threshold.
# Usage: chain_kernel_ab.py REPS BATCH NAME=PATH N   (e.g. 2 1 mt_bench=$D/mt_bench/question.jsonl 16)
import collections, sys, time, types, torch
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages, load_questions
from eaglespec.engine.calibrate import build_calibrated_proposer
from eaglespec.engine.generate import Engine, Request
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
from eaglespec.spec import proposer as P, verify
from eaglespec.spec.speculative import DraftOptions
allocator.tune()
torch.set_num_threads(2)
REPS, BATCH, SPEC, N = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
print("cpu:", cpu_kernels.cpuinfo("model name"), "torch", torch.__version__)
t = load_target()
qs = load_questions(SPEC, N, max_turns=1)
reqs = [Request(encode_messages(t.tokenizer, [{"role": "user", "content": q.turns[0]}]),
                GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=1.0, seed=i)))
        for i, q in enumerate(qs)]
groups = [reqs[i:i + BATCH] for i in range(0, len(reqs), BATCH)]
engs = {"vanilla": Engine(t, None, max_batch_size=BATCH),
        "chain1": Engine(t, build_calibrated_proposer(t, DraftOptions(tree="chain", depth=1)), max_batch_size=BATCH),
        "auto": Engine(t, build_calibrated_proposer(t, DraftOptions(tree="auto")), max_batch_size=BATCH)}
real = verify._chain_kernel_serves
off = types.SimpleNamespace(serves=lambda *a: False)
arms = [(e, k) for e in engs for k in ("kernel", "torch")]
wall, toks, same = collections.defaultdict(float), collections.defaultdict(int), collections.Counter()
with torch.inference_mode():
    for e in engs.values():
        e.generate(groups[0])
    for rep in range(REPS):
        for i, grp in enumerate(groups):
            k = (rep * len(groups) + i) % len(arms)
            outs = {}
            for name, mode in arms[k:] + arms[:k]:
                verify._chain_kernel_serves = real if mode == "kernel" else (lambda *a: False)
                P.cpu_kernels = cpu_kernels if mode == "kernel" else off
                a = time.perf_counter()
                outs[(name, mode)] = engs[name].generate(grp)
                wall[(name, mode)] += time.perf_counter() - a
                toks[(name, mode)] += sum(len(c.token_ids) for c in outs[(name, mode)])
            for name in engs:
                same[name] += sum(x.token_ids == y.token_ids for x, y in zip(outs[(name, "kernel")], outs[(name, "torch")]))
verify._chain_kernel_serves, P.cpu_kernels = real, cpu_kernels
for name in engs:
    kt, tt = wall[(name, "kernel")], wall[(name, "torch")]
    print(f"{name:8s} kernel {toks[(name, 'kernel')] / kt:7.2f} tok/s  torch {toks[(name, 'torch')] / tt:7.2f} tok/s  "
          f"kernel/torch speed {tt / kt:.4f}  same tokens {same[name]}/{REPS * len(reqs)}")
for mode in ("kernel", "torch"):
    v = wall[("vanilla", mode)]
    print(f"{mode}: chain1/vanilla speed {v / wall[('chain1', mode)]:.4f}  auto/vanilla {v / wall[('auto', mode)]:.4f}")
