import torch, sys
torch.set_num_threads(2)
from eaglespec.runtime.loading import load_target
from eaglespec.engine.calibrate import measure_verify
res={}
for kern in ("torch","w4a8"):
    m=load_target(None, int4_kernel=kern).model
    for row in (False, True):
        m.row_attention=row
        r=measure_verify(m, batches=[1,4], tokens=[1,2,4,8,16], prefix=256)
        for b in (1,4):
            v1=r[(b,1)]
            print(f"{kern:5s} row_attn={row!s:5s} b={b} verify(1)={v1*1e3:.2f} ms  " + " ".join(f"N={n}:{r[(b,n)]/v1:.2f}" for n in (2,4,8,16)), flush=True)
