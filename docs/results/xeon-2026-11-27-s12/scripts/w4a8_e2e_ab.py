# Eager end-to-end A/B of the w4a8 kernel builds: old (no prefetch, op pf0) vs the package's (prefetch), same process.
import sys, time, json, collections, statistics, torch
from torch.utils.cpp_extension import load
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.engine.generate import Engine, Request
import eaglespec.runtime.w4a8 as W
torch.set_num_threads(2)
B = int(sys.argv[1]); N = int(sys.argv[2]); REPS = int(sys.argv[3]); KINDS = sys.argv[4].split(",")
F = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]
load(name="pf0", sources=["/work/runs/s12/pf/w4a8_pf0.cpp"], extra_cflags=F, extra_ldflags=["-fopenmp"], is_python_module=False)
t = load_target()
OPS = {"old": torch.ops.pf0.w4a8_mm, "new": torch.ops.eaglespec.w4a8_mm}
cur = ["new"]
W.mm = lambda x, wq, s, o: OPS[cur[0]](x.float(), wq, s, o)
qs = [json.loads(l) for l in open("/work/shared/data/mt_bench/question.jsonl")]
cats = collections.defaultdict(list)
for q in qs: cats[q["category"]].append(q)
qs = [q for c in cats.values() for q in c[3:5]][:N]  # not the matrix's first 3 per category
tok = t.tokenizer
prompts = [tok(tok.apply_chat_template([{"role":"user","content":q["turns"][0]}], add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"] for q in qs]
reqs = [Request(p, GenerationConfig(128, ignore_eos=True, sampling=SamplingParams(temperature=0.0, seed=i))) for i, p in enumerate(prompts)]
engs = {k: Engine(t, None if k == "vanilla" else build_proposer(t, DraftOptions(tree=k, depth=1) if k == "chain" else DraftOptions(tree=k)), max_batch_size=B) for k in KINDS}
calls = [0]
f0 = OPS["old"]; OPS["old"] = lambda *a: (calls.__setitem__(0, calls[0] + 1), f0(*a))[1]
res = collections.defaultdict(list); outs_by = {}
with torch.inference_mode():
    for k, e in engs.items():
        for kern in ("old", "new"):
            cur[0] = kern; e.generate(reqs[:B])
    for rep in range(REPS):
        for k, e in engs.items():
            for kern in (("old", "new") if rep % 2 == 0 else ("new", "old")):
                cur[0] = kern
                t0 = time.perf_counter(); o = e.generate(reqs); dt = time.perf_counter() - t0
                ntok = sum(len(x.token_ids) for x in o)
                res[k, kern].append(ntok / dt)
                toks = [x.token_ids for x in o]
                assert outs_by.setdefault((k, kern), toks) == toks
                print(f"rep{rep} {k:8s} {kern} {ntok/dt:6.1f} tok/s", flush=True)
print("old-op calls", calls[0])
for k in KINDS:
    r = [b / a for a, b in zip(res[k, "old"], res[k, "new"])]
    print(f"{k:8s} old {statistics.median(res[k,'old']):.1f} new {statistics.median(res[k,'new']):.1f} tok/s; new/old per rep {' '.join(f'{x:.3f}' for x in r)}")
print("greedy identical old vs new:", all(outs_by[k, "old"] == outs_by[k, "new"] for k in KINDS), "; spec == vanilla:", all(outs_by[k, "new"] == outs_by[KINDS[0], "new"] for k in KINDS))
