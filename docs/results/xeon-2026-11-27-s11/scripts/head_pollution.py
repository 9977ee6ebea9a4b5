import sys, time, statistics, torch
from eaglespec.runtime.loading import load_target
from eaglespec.runtime.kvcache import HostRows
from eaglespec.spec.speculative import DraftOptions, build_proposer
import eaglespec.spec.heads as H
torch.set_num_threads(2)
t = load_target(); m = t.model
prop = build_proposer(t, DraftOptions(tree="chain", depth=1)); head = prop.head
P = 200
POLLUTE = sys.argv[1] == '1'
cache = head.new_cache(1, 512); rows = torch.arange(1)
g = torch.Generator().manual_seed(0)
F = head.config.feature_size
with torch.inference_mode():
    head(head.fuse(torch.randn(1, P, F, generator=g), prefill=True), torch.randint(49152, (1, P), generator=g), torch.arange(P)[None], cache, rows=rows, prefill=True)
    cache.advance(rows, torch.full((1,), P))
    def timeit(n, reps=60):
        f = torch.randn(1, n, F, generator=g); toks = torch.randint(49152, (1, n), generator=g); pos = (P + torch.arange(n))[None]
        h = HostRows((0,), (P,), P + n - 1)
        ts = []; tl = []
        tc = m.new_cache(1, 512); tc.advance(rows, torch.full((1,), P)); tt = torch.randint(49152, (1, 1)); tp = torch.full((1, 1), P)
        for i in range(reps):
            if POLLUTE: m(tt, tp, tc, rows=rows, logits_at="all", hidden_indices=(2, 15, 27), host=HostRows((0,), (P,), P))
            t0 = time.perf_counter(); o = head(head.fuse(f), toks, pos, cache, rows=rows, host=h); t1 = time.perf_counter()
            ids = head.to_target_ids(torch.log_softmax(head.logits(o[:, -1:]).float(), -1).topk(1, -1).indices); t2 = time.perf_counter()
            ts.append(t1 - t0); tl.append(t2 - t1)
        return 1e3 * statistics.median(ts[5:]), 1e3 * statistics.median(tl[5:])
    for rep in range(3):
        print(" ".join("n%d fwd %.3f logits %.3f" % ((n,) + timeit(n)) for n in (1, 2)), flush=True)
