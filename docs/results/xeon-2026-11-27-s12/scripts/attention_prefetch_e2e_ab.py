# Eager end-to-end A/B of row_attention builds (old vs prefetching), swapped in-process at model.py's call site.
import sys, time, json, collections, statistics, torch
from torch.utils.cpp_extension import load
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.config import GenerationConfig, SamplingParams
from eaglespec.engine.generate import Engine, Request
torch.set_num_threads(2)
B = int(sys.argv[1]); N = int(sys.argv[2]); REPS = int(sys.argv[3]); KINDS = sys.argv[4].split(","); LEN = int(sys.argv[5]) if len(sys.argv) > 5 else 128
F = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]
for n in ("old", "new"):
    load(name=f"ra{n}", sources=[f"/work/runs/s12/ra/{n}.cpp"], extra_cflags=F, extra_ldflags=["-fopenmp"], is_python_module=False)
t = load_target()
OPS = {"old": torch.ops.raold.row_attention, "new": torch.ops.ranew.row_attention}
g = torch.Generator().manual_seed(0)
for (Bq, H, HKV, D, T, S) in [(1, 9, 3, 64, 1, 37), (2, 9, 3, 64, 5, 100), (3, 8, 2, 128, 4, 70), (1, 12, 1, 64, 3, 50), (1, 4, 4, 32, 3, 17), (1, 9, 3, 64, 8, 264)]:
    q = torch.randn(Bq, H, T, D, generator=g); kc = torch.randn(Bq, HKV, S + 9, D, generator=g)[:, :, 3:S + 3]; vc = torch.randn(Bq, HKV, S, D, generator=g)
    for mask in (None, torch.rand(Bq, 1, T, S, generator=g) > 0.3):
        assert torch.equal(OPS["old"](q, kc, vc, mask), OPS["new"](q, kc, vc, mask))
print("bit-identical", flush=True)
cur = ["new"]
import eaglespec.runtime.model as M
real = torch.ops.eaglespec
class EaglespecNS:
    def __getattr__(self, name): return OPS[cur[0]] if name == "row_attention" else getattr(real, name)
ops_shim = type("O", (), {"__getattr__": lambda self, n: EaglespecNS() if n == "eaglespec" else getattr(torch.ops, n)})()
torch_shim = type("T", (), {"__getattr__": lambda self, n: ops_shim if n == "ops" else getattr(torch, n)})()
M.torch = torch_shim
qs = [json.loads(l) for l in open("/work/shared/data/mt_bench/question.jsonl")]
cats = collections.defaultdict(list)
for q in qs: cats[q["category"]].append(q)
qs = [q for c in cats.values() for q in c[3:5]][:N]
tok = t.tokenizer
prompts = [tok(tok.apply_chat_template([{"role":"user","content":q["turns"][0]}], add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"] for q in qs]
reqs = [Request(p, GenerationConfig(LEN, ignore_eos=True, sampling=SamplingParams(temperature=0.0, seed=i))) for i, p in enumerate(prompts)]
engs = {k: Engine(t, None if k == "vanilla" else build_proposer(t, DraftOptions(tree="chain", depth=int(k[5:])) if k.startswith("chain") else DraftOptions(tree=k)), max_batch_size=B) for k in KINDS}
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
for k in KINDS:
    r = [b / a for a, b in zip(res[k, "old"], res[k, "new"])]
    print(f"{k:8s} old {statistics.median(res[k,'old']):.1f} new {statistics.median(res[k,'new']):.1f} tok/s; new/old per rep {' '.join(f'{x:.3f}' for x in r)}")
print("greedy identical old vs new:", all(outs_by[k, "old"] == outs_by[k, "new"] for k in KINDS), "; spec == vanilla:", all(outs_by[k, "new"] == outs_by[KINDS[0], "new"] for k in KINDS))
