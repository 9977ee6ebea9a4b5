"""``eaglespec::verify_chain_sampled`` (kernels/verify_chain.cpp): a sampled chain's verification, and a sampled
plain step's draw, in one call, against the torch rule it replaces (``verify._verify_chain_sampling`` and
``verify._bonus``, the kernel off). Its distribution is checked by the oracle in test_verify.py (chains, kernel
on and off)."""

import pytest
import torch
from helpers import count_kernel_calls
from test_verify import make_tree

from eaglespec.runtime import cpu_kernels
from eaglespec.spec import verify
from eaglespec.spec.sampling import process_logits

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"our CPU kernels do not run here: {cpu_kernels.unavailable_reason()}")


def _chains(g, B, N, V, sampled):
    """Random chains whose candidates are often the target's likely tokens (acceptances and rejections), sparse p
    and q (top-k), and on odd rows candidates with q(x) = 0 where p(x) > 0 (the deterministic rule)."""
    probs = process_logits(2 * torch.randn(B, N, V, generator=g), 1.0, top_k=min(12, V))
    q = process_logits(2 * torch.randn(B, N, V, generator=g), 1.0, top_k=min(20, V))
    q = torch.where(torch.arange(B)[:, None, None] % 2 == 0, 0.5 * q + 0.5 * probs, q)
    tokens = torch.randint(0, V, (B, N), generator=g)
    likely = torch.multinomial(probs[:, :-1].reshape(-1, V), 1, generator=g).reshape(B, N - 1) if N > 1 else None
    if likely is not None:
        tokens[:, 1:] = torch.where(torch.rand(B, N - 1, generator=g) < 0.6, likely, tokens[:, 1:])
    tree = make_tree(tokens, list(range(-1, N - 1)), draft_q=q if sampled else None, chain=True)
    return tree, probs, torch.rand(B, N, generator=g), torch.rand(B, generator=g)


def _torch_verdict(monkeypatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(verify, "_chain_kernel_serves", lambda *a: False)
        return verify.verify_sampling(*args, **kw)


def _clear_of_boundaries(tree, probs, u, tol=1e-5):
    """Rows whose acceptance tests all sit farther than ``tol`` from their threshold (float64 ratios without q,
    where the rule compares u with p(x)): there both sums' orders must decide alike."""
    B, N, _ = probs.shape
    if N == 1:
        return torch.ones(B, dtype=torch.bool)
    p = probs.double() / probs.double().sum(-1, keepdim=True)
    px = p[:, :-1].gather(2, tree.tokens[:, 1:, None]).squeeze(2)  # [B, N-1]
    if tree.draft_q is not None:
        q = tree.draft_q.double() / tree.draft_q.double().sum(-1, keepdim=True).clamp_min(1e-300)
        qx = q[:, :-1].gather(2, tree.tokens[:, 1:, None]).squeeze(2)
        px = torch.where(qx > 0, px / qx.clamp_min(1e-300), px)
    return ((u[:, 1:].double() - px).abs() > tol).all(dim=1)


@pytest.mark.parametrize("V", [40, 1000, 49152])
@pytest.mark.parametrize("N", [1, 2, 3, 5])
@pytest.mark.parametrize("sampled", [False, True], ids=["topk_children", "sampled_children"])
def test_the_kernel_gives_the_torch_rules_verdict(V, N, sampled, monkeypatch):
    """The same path, acceptance count and bonus as the torch rule, the bonus's probability within float32
    rounding (both sum the vocabulary, in different fixed orders), for rows clear of every acceptance threshold
    (a bonus uniform within rounding of its CDF's boundary, ~1e-6 a row, would show as a failure here)."""
    g = torch.Generator().manual_seed(V + 10 * N + sampled)
    B = 400 if V < 49152 else 24
    tree, probs, u, u_bonus = _chains(g, B, N, V, sampled)
    with monkeypatch.context() as m:
        calls = count_kernel_calls(m, "verify_chain_sampled")
        got = verify.verify_sampling(tree, probs, u, u_bonus, sampled, max_depth=N - 1)
    assert calls == [1]
    want = _torch_verdict(monkeypatch, tree, probs, u, u_bonus, sampled, max_depth=N - 1)
    clear = _clear_of_boundaries(tree, probs, u)
    assert clear.sum() > 0.9 * B
    for name in ("path", "n_accepted", "bonus"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a[clear], b[clear]), name
    torch.testing.assert_close(got.bonus_p[clear], want.bonus_p[clear], rtol=1e-5, atol=1e-7)
    if V == 40 and N > 1:
        assert 0 < got.n_accepted.float().mean() < N - 1  # acceptances and rejections both happened


def test_a_plain_step_draws_as_sample_rows_does(monkeypatch):
    """N = 1 (vanilla decoding, a paused step): the bonus is ``sample_rows``' draw from p, its probability p(bonus),
    and the path as wide as asked (max_depth)."""
    g = torch.Generator().manual_seed(5)
    probs = process_logits(3 * torch.randn(6, 1, 49152, generator=g), 0.7, top_p=0.9)
    tree = make_tree(torch.randint(0, 49152, (6, 1), generator=g), [-1])
    u, u_bonus = torch.rand(6, 1, generator=g), torch.rand(6, generator=g)
    got = verify.verify_sampling(tree, probs, u, u_bonus, False, max_depth=2)
    assert torch.equal(got.bonus, torch.ops.eaglespec.sample_rows(probs[:, 0].contiguous(), u_bonus))
    assert got.path.tolist() == [[0, -1, -1]] * 6 and got.n_accepted.tolist() == [0] * 6
    torch.testing.assert_close(got.bonus_p, probs[:, 0].gather(1, got.bonus[:, None])[:, 0], rtol=1e-5, atol=0)


def test_the_kernel_refuses_what_it_cannot_verify():
    p = torch.softmax(torch.randn(2, 3, 50), -1)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    u, us = torch.rand(2, 3), torch.rand(2)
    op = torch.ops.eaglespec.verify_chain_sampled
    with pytest.raises(RuntimeError, match="outside"):
        op(torch.tensor([[0, 3, 50], [0, 1, 2]]), p, None, u, us, 3)
    with pytest.raises(RuntimeError, match="outside"):
        op(torch.tensor([[0, -1, 5], [0, 1, 2]]), p, None, u, us, 3)
    with pytest.raises(RuntimeError, match="q must be float32 shaped as p"):
        op(tokens, p, p[:, :2].contiguous(), u, us, 3)
    with pytest.raises(RuntimeError, match="u_accept must be float32"):
        op(tokens, p, None, u[:, :2], us, 3)
    with pytest.raises(RuntimeError, match="width must be >= N"):
        op(tokens, p, None, u, us, 2)
    with pytest.raises(RuntimeError, match="p must be float32"):
        op(tokens, p.double(), None, u, us, 3)
