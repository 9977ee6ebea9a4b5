# Prompt forwards with eaglespec::row_attention (now) against the float64 flash kernel (before; model.row_attention
# off for the prompt only), alternating in one process: prefill seconds of an L-token prompt (Alpaca training
# texts joined) at batch B, median of 5 rounds each.
import json, statistics, sys, time, torch
from eaglespec.runtime import allocator, cpu_kernels
from eaglespec.runtime.loading import load_target
allocator.tune(); torch.set_num_threads(2)
path, B = sys.argv[1], int(sys.argv[2])
print("cpu:", cpu_kernels.cpuinfo("model name"), "torch", torch.__version__, "batch", B)
t = load_target(); m = t.model
text = " ".join(d["instruction"] + " " + d.get("output", "") for d in json.load(open(path))[:400])
ids = t.tokenizer.encode(text)
for L in [int(x) for x in sys.argv[3].split(",")]:
    toks = torch.tensor([ids[i * 50:i * 50 + L] for i in range(B)])
    times = {True: [], False: []}
    with torch.inference_mode():
        for rep in range(6):
            for mode in ((True, False) if rep % 2 == 0 else (False, True)):
                m.row_attention = mode
                cache = m.new_cache(B, L + 4)
                a = time.perf_counter()
                m(toks, torch.arange(L)[None].expand(B, -1), cache, rows=torch.arange(B), prefill=True)
                if rep: times[mode].append(time.perf_counter() - a)
    m.row_attention = True
    new, old = statistics.median(times[True]), statistics.median(times[False])
    print(f"L={L:5d} b{B}: row_attention {new * 1e3:8.1f} ms  float64 flash {old * 1e3:8.1f} ms  speedup {old / new:.2f}x  "
          f"({B * L / new:.0f} vs {B * L / old:.0f} prompt tokens/s)")
