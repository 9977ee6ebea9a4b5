"""``eaglespec::draft_draw`` (kernels/draft_draw.cpp): the draft head's sampled children in one call, against
``EagleProposer.children``' torch rule (the same method, our kernels off), and its draws' frequencies."""

import pytest
import torch
from helpers import count_kernel_calls, tiny_target
from test_speculative import make_head

from eaglespec.runtime import cpu_kernels
from eaglespec.spec import proposer as proposer_mod
from eaglespec.spec.proposer import EagleProposer
from eaglespec.spec.strategies import Chain

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"our CPU kernels do not run here: {cpu_kernels.unavailable_reason()}")


@pytest.fixture(scope="module")
def proposer():
    target, _ = tiny_target("llama")
    return EagleProposer(make_head(target, "eagle3"), Chain(1))


def _children(p, o, temps, seeds, kernel, monkeypatch):
    """``p.children(o, 1)`` for rows at ``temps``, each row's generator seeded afresh (None: a greedy row)."""
    p._step_temperature = torch.tensor(temps, dtype=torch.float32)
    p._step_generators = [torch.Generator().manual_seed(s) if t > 0 else None for s, t in zip(seeds, temps)]
    with monkeypatch.context() as m:
        if not kernel:
            m.setattr(proposer_mod.cpu_kernels, "serves", lambda *t: False)
        return p.children(o, 1)


def test_the_kernel_draws_the_torch_rules_children(proposer, monkeypatch):
    """The same child ids (rows clear of a CDF boundary), log q and q within float32 rounding, at temperatures
    0 (a greedy row of a mixed batch: the first largest), 0.5, 1 and 1.7, several nodes a row."""
    g = torch.Generator().manual_seed(3)
    temps = [0.0, 0.5, 1.0, 1.7] * 16
    B, K = len(temps), 3
    o = torch.randn(B, K, proposer.head.config.hidden_size, generator=g) * 4
    seeds = list(range(B))
    with monkeypatch.context() as m:
        calls = count_kernel_calls(m, "draft_draw")
        ids, lq, q = _children(proposer, o, temps, seeds, True, monkeypatch)
    assert calls == [1]
    want_ids, want_lq, want_q = _children(proposer, o, temps, seeds, False, monkeypatch)
    assert ids.shape == want_ids.shape == (B, K, 1) and ids.dtype == want_ids.dtype
    assert q.shape == want_q.shape and lq.shape == want_lq.shape
    torch.testing.assert_close(q, want_q, rtol=1e-5, atol=1e-8)
    # a row's uniform within rounding of its CDF's boundary may draw the neighbour: none of these should be
    u = torch.stack([torch.rand(K, generator=torch.Generator().manual_seed(s)) for s in seeds]).double()  # [B, K]
    d2t = proposer._draft_to_target()
    qd = want_q[:, :, d2t].double()  # [B, K, V'] in draft order
    cdf = qd.cumsum(-1)
    clear = (cdf - u[..., None] * cdf[..., -1:]).abs().amin(-1) > 1e-5
    assert clear.float().mean() > 0.95
    assert torch.equal(ids[clear], want_ids[clear])
    torch.testing.assert_close(lq, want_lq, rtol=1e-5, atol=1e-5)
    greedy = torch.tensor(temps) == 0
    assert torch.equal(ids[greedy], want_ids[greedy])  # argmax rows: no uniform involved


def test_draws_follow_q(proposer):
    """One node's logits repeated over 60,000 nodes with fresh uniforms: the children's frequencies match q."""
    from stats import P_VALUE_MIN, chi_square

    g = torch.Generator().manual_seed(4)
    v, n = 24, 60_000
    logits = (torch.randn(v, generator=g) * 2).expand(1, n, v).contiguous()
    d2t = torch.arange(v) * 3  # draft id j -> target id 3j
    ids, lq, q = torch.ops.eaglespec.draft_draw(logits, torch.tensor([0.8]), torch.rand(1, n, generator=g), d2t, 3 * v)
    want = torch.softmax(logits[0, 0] / 0.8, -1)
    torch.testing.assert_close(q[0, 0, d2t], want, rtol=1e-5, atol=1e-8)
    assert q[0, 0].sum().item() == pytest.approx(1.0, abs=1e-5) and (q[0, 0, 1::3] == 0).all()
    assert (ids % 3 == 0).all()
    stat, dof, p_value = chi_square(torch.bincount(ids[0] // 3, minlength=v), want)
    assert p_value > P_VALUE_MIN, (stat, dof, p_value)
    torch.testing.assert_close(lq[0], want.log()[ids[0] // 3], rtol=1e-5, atol=1e-5)


def test_draft_draw_refuses_bad_input():
    op = torch.ops.eaglespec.draft_draw
    x, t, u, d2t = torch.randn(2, 1, 8), torch.ones(2), torch.rand(2, 1), torch.arange(8)
    with pytest.raises(RuntimeError, match="outside"):
        op(x, t, u, d2t + 5, 10)
    with pytest.raises(RuntimeError, match="V' <= vocab"):
        op(x, t, u, d2t, 4)
    with pytest.raises(RuntimeError, match="u must be float32"):
        op(x, t, u[:1], d2t, 8)
    with pytest.raises(RuntimeError, match="d2t must be int64"):
        op(x, t, u, d2t[:4], 8)
    with pytest.raises(RuntimeError, match="logits must be float32"):
        op(x.double(), t, u, d2t, 8)


def test_a_greedy_row_takes_the_first_largest():
    """Temperature 0 (a greedy request in a sampled batch): the first index among equal maxima, as torch's argmax,
    whatever the uniform; the maxima in one 16-value block or in different ones."""
    x = torch.zeros(1, 4, 40)
    x[0, 0, [3, 9]] = 5.0  # one block
    x[0, 1, [7, 20]] = 5.0  # two blocks
    x[0, 2, [33, 39]] = 5.0  # the partial last block
    x[0, 3] = torch.arange(40.0).round() % 4  # many ties, the first 3.0 at index 3
    ids, _, _ = torch.ops.eaglespec.draft_draw(x, torch.zeros(1), torch.full((1, 4), 0.99), torch.arange(40), 40)
    assert ids[0].tolist() == [3, 7, 33, 3] == x[0].argmax(-1).tolist()
