import sys, torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from build import build
build("ra_v0")
from eaglespec.runtime import cpu_kernels
assert cpu_kernels.available()
g = torch.Generator().manual_seed(0)
for trial in range(50):
    B = int(torch.randint(1, 4, (1,), generator=g)); T = int(torch.randint(1, 20, (1,), generator=g)); S = int(torch.randint(T, 400, (1,), generator=g))
    H, Hkv, D = [(9, 3, 64), (8, 2, 128), (12, 1, 64), (4, 4, 32)][trial % 4]
    q = torch.randn(B, H, T, D, generator=g); k = torch.randn(B, Hkv, S, D, generator=g); v = torch.randn(B, Hkv, S, D, generator=g)
    mask = torch.rand(B, 1, T, S, generator=g) > 0.2
    mask[..., :S // 2] = True; mask[..., -1] = True
    for mk in (mask, None):
        a = torch.ops.ra_v0.row_attention(q, k, v, mk); b = torch.ops.eaglespec.row_attention(q, k, v, mk)
        assert torch.equal(a, b), (trial, B, T, S, H, Hkv, D)
print("bit-identical to the previous kernel on 100 random cases")
