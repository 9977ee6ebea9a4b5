"""Tree verification: hand-made greedy cases, and the losslessness oracle for speculative sampling.

The oracle: a tiny "language model" (an order-2 Markov table over V=6 tokens) is the target; a different
table is the draft. We decode 100k sequences at once with the real verifier (draft a tree of depth 3,
verify, commit, repeat until every sequence has 3 tokens) and compare the empirical joint distribution of
the first 3 committed tokens (216 cells) with the target's exact joint distribution, by a chi-square
goodness-of-fit test (`chi_square` in test_sampling.py).

Threshold and power: the test passes when the p-value is above 1e-3, i.e. a correct verifier would fail for
1 seed in 1000 (seeds are fixed, so the test is deterministic). At 100k samples and ~215 degrees of
freedom, a verifier whose cell probabilities are all off by 3% relative adds about 100k * 0.03^2 = 90 to
the expected statistic (215), past the 1e-3 critical value (~290); real bugs are far larger. A verifier
that keeps rejected tokens in the residual (`no_residual_update` below) scores in the thousands already at 20k samples.
"""

from __future__ import annotations

import pytest
import torch
from helpers import count_kernel_calls
from stats import P_VALUE_MIN, chi_square

from eaglespec.spec import verify
from eaglespec.spec.sampling import process_logits, sample_from_probs
from eaglespec.spec.tree import DraftTree
from eaglespec.spec.verify import Verdict, verify_greedy, verify_sampling


def make_tree(tokens, parents, valid=None, draft_q=None, chain=False) -> DraftTree:
    """DraftTree from tokens [B, N] and parents (one list shared by all rows, or [B, N]); ``chain``: flagged as a
    chain (node i the parent of node i + 1), which the verifiers take a shortcut for."""
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    B, N = tokens.shape
    parents = torch.as_tensor(parents, dtype=torch.long).expand(B, N).clone()
    valid = torch.ones(B, N, dtype=torch.bool) if valid is None else torch.as_tensor(valid).expand(B, N).clone()
    parents = torch.where(valid, parents, -1)  # padding nodes have parent -1
    depth = torch.zeros(B, N, dtype=torch.long)
    for j in range(1, N):  # parents come before children
        depth[:, j] = torch.where(parents[:, j] >= 0, depth.gather(1, parents[:, j : j + 1].clamp_min(0))[:, 0] + 1, 0)
    tree = DraftTree(tokens, parents, depth, valid, torch.zeros(B, N), draft_q, chain=chain)
    if B <= 1000:  # validate() walks the rows on the host: too slow for the 200k-row oracle
        tree.validate()
    return tree


def one_hot_logits(argmax, V: int) -> torch.Tensor:
    """[B, N] target argmax per node -> logits [B, N, V] with that argmax (and some noise elsewhere)."""
    argmax = torch.as_tensor(argmax)
    g = torch.Generator().manual_seed(0)
    logits = torch.rand(*argmax.shape, V, generator=g)
    return logits.scatter(-1, argmax[..., None], 5.0)


# ---------------------------------------------------------------------------------------------------- greedy

#        0 (root)
#       / \
#      1   2        tokens: node 1 = 3, node 2 = 1
#      |   |
#      3   4        node 3 = 4, node 4 = 2
#      |
#      5            node 5 = 0
PARENTS_A = [-1, 0, 0, 1, 2, 3]
TOKENS_A = [9, 3, 1, 4, 2, 0]
V_A = 10


def test_greedy_full_partial_none_branching_in_one_batch():
    argmax = [
        [3, 4, 9, 0, 9, 2],  # full: 0 -> 1 -> 3 -> 5, bonus = argmax at 5
        [3, 4, 9, 1, 9, 9],  # partial: 0 -> 1 -> 3, then argmax 1 matches no child of 3
        [0, 9, 9, 9, 9, 9],  # none
        [1, 9, 2, 9, 7, 9],  # branching: the second child of the root matches, then node 4
    ]
    tree = make_tree([TOKENS_A] * 4, PARENTS_A)
    v = verify_greedy(tree, one_hot_logits(argmax, V_A))
    assert v.path.tolist() == [[0, 1, 3, 5], [0, 1, 3, -1], [0, -1, -1, -1], [0, 2, 4, -1]]
    assert v.n_accepted.tolist() == [3, 2, 0, 2]
    assert v.bonus.tolist() == [2, 1, 0, 7]


def test_greedy_ignores_padding_nodes_and_takes_the_first_matching_sibling():
    # row 0: node 2 is padding although its token equals the root argmax
    # row 1: nodes 1 and 2 both carry the argmax token: the lower index wins
    tokens = [[9, 3, 1, 4, 2, 0], [9, 1, 1, 4, 2, 0]]
    valid = [[True, True, False, True, False, True], [True] * 6]
    argmax = [[1, 9, 9, 9, 9, 9], [1, 4, 9, 9, 9, 9]]
    v = verify_greedy(make_tree(tokens, PARENTS_A, valid), one_hot_logits(argmax, V_A))
    assert v.path.tolist() == [[0, -1, -1, -1], [0, 1, 3, -1]]
    assert v.n_accepted.tolist() == [0, 2]
    assert v.bonus.tolist() == [1, 9]


def test_greedy_root_only_is_vanilla_argmax():
    logits = torch.randn(5, 1, 7, generator=torch.Generator().manual_seed(1))
    v = verify_greedy(make_tree(torch.arange(5)[:, None], [-1]), logits)
    assert v.path.tolist() == [[0]] * 5
    assert v.n_accepted.tolist() == [0] * 5
    assert torch.equal(v.bonus, logits[:, 0].argmax(-1))


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_greedy_chains_take_the_running_match_as_the_tree_walk_does(depth):
    # chain=True takes the one-product path; the same trees unflagged walk level by level. Drafts copy the
    # target's tokens with a few errors so every acceptance length 0..depth occurs.
    g = torch.Generator().manual_seed(depth)
    B, N, V = 64, depth + 1, 5
    logits = torch.randn(B, N, V, generator=g)
    target = logits.argmax(-1)
    tokens = torch.cat([torch.zeros(B, 1, dtype=torch.long), target[:, :-1]], dim=1)
    wrong = torch.rand(B, N, generator=g) < 0.3
    tokens = torch.where(wrong, (tokens + 1) % V, tokens)
    walked = make_tree(tokens, list(range(-1, depth)))
    chain = DraftTree(walked.tokens, walked.parents, walked.depth, walked.valid, walked.draft_logp, chain=True)
    for max_depth in (None, depth):
        fast, slow = verify_greedy(chain, logits, max_depth=max_depth), verify_greedy(walked, logits)
        assert torch.equal(fast.path, slow.path) and torch.equal(fast.n_accepted, slow.n_accepted)
        assert torch.equal(fast.bonus, slow.bonus)
    assert set(fast.n_accepted.tolist()) == set(range(depth + 1))
    if depth > 1:  # a cut below the chain's depth prunes as for any tree
        cut = verify_greedy(chain, logits, max_depth=1)
        assert torch.equal(cut.n_accepted, slow.n_accepted.clamp(max=1))


def test_max_depth_sizes_the_path_and_prunes_deeper_nodes():
    argmax = [[3, 4, 9, 0, 9, 2]]
    tree = make_tree([TOKENS_A], PARENTS_A)
    logits = one_hot_logits(argmax, V_A)
    probs = process_logits(logits, 0.0)
    u = torch.zeros(1, 6), torch.zeros(1)

    def greedy(d):
        return verify_greedy(tree, logits, max_depth=d)

    def sampling(d):
        return verify_sampling(tree, probs, *u, False, max_depth=d)

    for fn in (greedy, sampling):
        wide, cut = fn(5), fn(1)
        assert wide.path.tolist() == [[0, 1, 3, 5, -1, -1]] and wide.bonus.tolist() == [2]
        assert cut.path.tolist() == [[0, 1]] and cut.n_accepted.tolist() == [1] and cut.bonus.tolist() == [4]


# ------------------------------------------------------------------------------------- sampling: exact cases


def test_sampling_with_one_hot_targets_equals_greedy():
    """At temperature 0, p is one-hot: both sampling rules must reproduce greedy verification exactly."""
    g = torch.Generator().manual_seed(3)
    B, V = 500, 5
    tokens = torch.randint(0, V, (B, 6), generator=g)
    valid = torch.rand(B, 6, generator=g) > 0.15
    valid[:, 0] = True
    valid[:, 3] &= valid[:, 1]  # a padding node has no valid descendants
    valid[:, 4] &= valid[:, 2]
    valid[:, 5] &= valid[:, 3]
    draft_q = torch.softmax(torch.randn(B, 6, V, generator=g), -1)
    tree = make_tree(tokens, PARENTS_A, valid, draft_q)
    logits = torch.randn(B, 6, V, generator=g)
    probs = process_logits(logits, 0.0)
    want = verify_greedy(tree, logits)
    for sampled in (False, True):
        got = verify_sampling(tree, probs, torch.rand(B, 6, generator=g), torch.rand(B, generator=g), sampled)
        assert torch.equal(got.path, want.path) and torch.equal(got.bonus, want.bonus)
        assert torch.equal(got.n_accepted, want.n_accepted)
    assert (want.n_accepted >= 2).any() and (want.n_accepted == 0).any()


def test_sampling_root_only_is_a_sample_of_p():
    g = torch.Generator().manual_seed(4)
    probs = torch.softmax(torch.randn(50, 1, 9, generator=g), -1)
    u = torch.rand(50, generator=g)
    for sampled in (False, True):
        tree = make_tree(torch.zeros(50, 1), [-1], draft_q=probs if sampled else None)
        v = verify_sampling(tree, probs, torch.rand(50, 1, generator=g), u, sampled)
        assert v.path.tolist() == [[0]] * 50 and v.n_accepted.tolist() == [0] * 50
        assert torch.equal(v.bonus, sample_from_probs(probs[:, 0], u))


def test_a_draft_equal_to_the_target_is_always_accepted():
    """q == p: min(1, p/q) = 1 for every sampled child, so the walk takes the first child to the deepest leaf."""
    g = torch.Generator().manual_seed(5)
    B, V = 1000, 6
    probs = torch.softmax(torch.randn(B, 6, V, generator=g), -1)
    tree = make_tree(torch.randint(0, V, (B, 6), generator=g), PARENTS_A, draft_q=probs.clone())
    v = verify_sampling(tree, probs, torch.rand(B, 6, generator=g), torch.rand(B, generator=g), True)
    assert (v.path == torch.tensor([0, 1, 3, 5])).all() and (v.n_accepted == 3).all()


def test_rows_are_verified_independently_of_their_batch():
    g = torch.Generator().manual_seed(6)
    B, V = 8, 5
    valid = torch.ones(B, 6, dtype=torch.bool)
    valid[::2, 4] = False  # ragged: half the rows have a padding node
    q = torch.softmax(torch.randn(B, 6, V, generator=g), -1)
    tree = make_tree(torch.randint(0, V, (B, 6), generator=g), PARENTS_A, valid, q)
    probs = torch.softmax(torch.randn(B, 6, V, generator=g), -1)
    u_acc, u_s = torch.rand(B, 6, generator=g), torch.rand(B, generator=g)
    for sampled in (False, True):
        batch = verify_sampling(tree, probs, u_acc, u_s, sampled, max_depth=3)
        for b in range(B):
            row = make_tree(tree.tokens[b : b + 1], tree.parents[b : b + 1], tree.valid[b : b + 1], q[b : b + 1])
            alone = verify_sampling(row, probs[b : b + 1], u_acc[b : b + 1], u_s[b : b + 1], sampled, max_depth=3)
            assert torch.equal(alone.path[0], batch.path[b]) and alone.bonus[0] == batch.bonus[b]


def test_degenerate_draft_distributions_give_no_nan_and_no_zero_probability_tokens():
    """q(x) = 0 for a sampled child (q exhausted or inconsistent) and targets with zeros."""
    g = torch.Generator().manual_seed(7)
    B, V = 2000, 4
    q = torch.zeros(B, 6, V)
    q[:, :, 0] = 1.0  # every node's draft puts all mass on token 0 ...
    q[B // 2 :] = 0.0  # ... or none at all
    tree = make_tree(torch.randint(0, V, (B, 6), generator=g), PARENTS_A, draft_q=q)
    probs = torch.softmax(torch.randn(B, 6, V, generator=g), -1)
    probs[:, :, 1] = 0.0  # token 1 is impossible under the target
    probs = probs / probs.sum(-1, keepdim=True)
    v = verify_sampling(tree, probs, torch.rand(B, 6, generator=g), torch.rand(B, generator=g), True)
    accepted = v.path[:, 1:]
    assert (tree.tokens.gather(1, accepted.clamp_min(0))[accepted >= 0] != 1).all()
    assert (v.bonus != 1).all()
    assert v.n_accepted.max() > 0 and (v.n_accepted >= 0).all()


def test_sampled_children_need_draft_q():
    tree = make_tree([[0, 1]], [-1, 0])
    with pytest.raises(ValueError, match="draft_q"):
        verify_sampling(tree, torch.full((1, 2, 3), 1 / 3), torch.zeros(1, 2), torch.zeros(1), True)


# --------------------------------------------------------------------------------- sampling: the oracle

V = 6
#          0
#        / | \
#       1  2  3
#      / \  \
#     4   5  6
#     |
#     7            node 8: padding
PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4, -1]
CHILDREN = {0: [1, 2, 3], 1: [4, 5], 2: [6], 4: [7]}
N = len(PARENTS)
CHAIN = False  # the oracle's tree flagged as a chain (``use_chain_of_3``)
START = (2, 5)  # (token before the root, root = pending token)
K = 3  # committed tokens compared with the exact joint distribution (V**K = 216 cells)
ROWS = 100_000  # per oracle run; see the module docstring for the power this gives
BROKEN_ROWS = 20_000  # a lossy verifier is caught with far fewer


def markov_table(g: torch.Generator, floor: float) -> torch.Tensor:
    """Random order-2 next-token table [V, V, V]: table[a, b] = p(next | previous two tokens a, b).
    Mixed with `floor` of the uniform distribution so every cell of the joint is observed often enough."""
    peaked = torch.softmax(2.0 * torch.randn(V, V, V, generator=g), -1)
    return (1 - floor) * peaked + floor / V


def build_tree(prev, root, draft_table, sampled: bool, g):
    """Draft one tree per row: children of a node are the top-m tokens of the draft distribution at the
    node (sampled=False) or m tokens drawn from it without replacement, in draw order (sampled=True;
    Gumbel-top-m, which is exactly sequential sampling without replacement). Returns (tree, before) where
    before[b, j] is the token preceding node j's token (the order-2 context of the node)."""
    B = prev.shape[0]
    tokens = torch.zeros(B, N, dtype=torch.long)
    before = torch.zeros(B, N, dtype=torch.long)
    tokens[:, 0], before[:, 0] = root, prev
    for a, kids in CHILDREN.items():
        q = draft_table[before[:, a], tokens[:, a]]  # [B, V]
        keys = q
        if sampled:
            gumbel = -torch.log(-torch.log(torch.rand(B, V, generator=g).clamp_min(1e-12)))
            keys = q.log() + gumbel  # log 0 = -inf: zero-probability tokens come last
        tokens[:, kids] = keys.topk(len(kids), dim=-1).indices  # [B, m], in draw / rank order
        before[:, kids] = tokens[:, a : a + 1]
    valid = torch.tensor(PARENTS) >= 0
    valid[0] = True
    draft_q = draft_table[before, tokens]  # [B, N, V]
    tree = make_tree(tokens, PARENTS, valid, draft_q if sampled else None, chain=CHAIN)  # draft_logp (unused) = 0
    return tree, before


def decode(target_at, draft_table, sampled: bool, seed: int, rows: int) -> torch.Tensor:
    """Decode `rows` sequences from START with the verifier until each has K committed tokens -> [rows, K]."""
    g = torch.Generator().manual_seed(seed)
    prev = torch.full((rows,), START[0])
    root = torch.full((rows,), START[1])
    width = 4  # D + 1 of the tree above
    out = torch.full((rows, K * width + 1), -1)  # last column: dump for tokens not committed
    count = torch.zeros(rows, dtype=torch.long)
    for _ in range(K):  # every step commits at least one token
        tree, before = build_tree(prev, root, draft_table, sampled, g)
        p = target_at(before, tree.tokens)  # [rows, N, V]
        v = verify_sampling(tree, p, torch.rand(rows, N, generator=g), torch.rand(rows, generator=g), sampled)
        assert v.path.shape[1] == width
        # committed this step: tokens of path[1..n_accepted], then the bonus
        step = tree.tokens.gather(1, v.path[:, 1:].clamp_min(0))  # [rows, D]
        step = torch.cat([step, step[:, :1]], 1).scatter(1, v.n_accepted[:, None], v.bonus[:, None])  # [rows, D+1]
        keep = torch.arange(width) <= v.n_accepted[:, None]  # [rows, D+1]
        col = torch.where(keep, count[:, None] + torch.arange(width), out.shape[1] - 1)
        out.scatter_(1, col, step)
        count += v.n_accepted + 1
        last = v.path.gather(1, v.n_accepted[:, None])  # [rows, 1] last accepted node
        prev, root = tree.tokens.gather(1, last)[:, 0], v.bonus
    return out[:, :K]


def exact_joint(table: torch.Tensor) -> torch.Tensor:
    """p(c1, c2, c3 | START) under the order-2 table -> [V**K]."""
    a, b = START
    joint = table[a, b][:, None, None] * table[b][:, :, None] * table  # [V, V, V]
    return joint.reshape(-1)


def joint_counts(tokens: torch.Tensor) -> torch.Tensor:
    cells = (tokens * torch.tensor([V * V, V, 1])).sum(-1)
    return torch.bincount(cells, minlength=V**K)


def fit(target_table, target_at, draft_table, sampled, seed, rows=ROWS):
    counts = joint_counts(decode(target_at, draft_table, sampled, seed, rows))
    return chi_square(counts, exact_joint(target_table))


def tables(seed: int):
    g = torch.Generator().manual_seed(seed)
    target = markov_table(g, floor=0.3)
    draft = 0.5 * target + 0.5 * markov_table(g, floor=0.0)  # related to the target, not equal to it
    return target, draft


def lookup(table):
    return lambda before, tokens: table[before, tokens]


@pytest.mark.parametrize("sampled", [False, True], ids=["topk_children", "sampled_children"])
def test_speculative_sampling_reproduces_the_target_distribution(sampled):
    target, draft = tables(10)
    stat, dof, p_value = fit(target, lookup(target), draft, sampled, seed=11)
    assert p_value > P_VALUE_MIN, (stat, dof, p_value)


def use_chain_of_3(monkeypatch):
    """The oracle's trees: chains of 3 flagged as chains (``verify._verify_chain_sampling``)."""
    import sys

    mod = sys.modules[__name__]
    for name, value in (("PARENTS", [-1, 0, 1, 2]), ("CHILDREN", {0: [1], 1: [2], 2: [3]}), ("N", 4), ("CHAIN", True)):
        monkeypatch.setattr(mod, name, value)


def chain_kernel(monkeypatch, on: bool) -> None:
    """Chains (and plain steps) verified by ``eaglespec::verify_chain_sampled`` (on: skipped where our CPU kernels
    do not run) or by the torch rule (off), whatever earlier tests loaded."""
    from eaglespec.runtime import cpu_kernels

    if on:
        if not cpu_kernels.available():
            pytest.skip(f"our CPU kernels do not run here: {cpu_kernels.unavailable_reason()}")
    else:
        monkeypatch.setattr(verify, "_chain_kernel_serves", lambda *a: False)


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize("sampled", [False, True], ids=["topk_children", "sampled_children"])
def test_speculative_sampling_of_chains_reproduces_the_target_distribution(sampled, kernel, monkeypatch):
    use_chain_of_3(monkeypatch)
    chain_kernel(monkeypatch, kernel)
    if kernel:
        calls = count_kernel_calls(monkeypatch, "verify_chain_sampled")
    else:
        calls = []
        real = verify._verify_chain_sampling
        monkeypatch.setattr(verify, "_verify_chain_sampling", lambda *a: calls.append(1) or real(*a))
    target, draft = tables(12)
    stat, dof, p_value = fit(target, lookup(target), draft, sampled, seed=13)
    assert p_value > P_VALUE_MIN, (stat, dof, p_value)
    assert calls  # the chain shortcut (or its kernel) ran


@pytest.mark.parametrize("sampled", [False, True], ids=["topk_children", "sampled_children"])
def test_the_oracle_detects_a_chain_verifier_that_skips_the_residual(sampled, monkeypatch):
    """The chain shortcut with every row's bonus drawn from p at the node it stopped at, rejected or not (the
    residual never taken): caught."""
    use_chain_of_3(monkeypatch)
    chain_kernel(monkeypatch, False)
    monkeypatch.setattr(verify, "_rows_of", lambda a, b, take_a: b)
    target, draft = tables(12)
    stat, dof, p_value = fit(target, lookup(target), draft, sampled, seed=13, rows=BROKEN_ROWS)
    assert p_value < 1e-30, (stat, dof, p_value)


def test_the_chain_shortcut_gives_the_walks_verdict(monkeypatch):
    """Chains verified by the shortcut and by the general walk (the same tree not flagged as a chain): the same
    path, acceptance count, bonus and bonus probability, sampled and top-k children, sparse p and q. (The
    torch shortcut; its kernel against it: ``test_verify_chain.py``.)"""
    chain_kernel(monkeypatch, False)
    g = torch.Generator().manual_seed(31)
    B, V = 300, 40
    for N in (2, 3, 5):
        for sampled in (False, True):
            tokens = torch.randint(0, V, (B, N), generator=g)
            tokens[:, 1:] = torch.where(torch.rand(B, N - 1, generator=g) < 0.5, tokens[:, :1], tokens[:, 1:])
            probs = process_logits(2 * torch.randn(B, N, V, generator=g), 1.0, top_k=12)
            q = process_logits(2 * torch.randn(B, N, V, generator=g), 1.0, top_k=20)
            q = torch.where(torch.arange(B)[:, None, None] % 2 == 0, 0.5 * q + 0.5 * probs, q)  # even rows
            # often accepted; odd rows' q(x) = 0 where p(x) > 0 too (the deterministic rule)
            u, u_bonus = torch.rand(B, N, generator=g), torch.rand(B, generator=g)
            fast = make_tree(tokens, list(range(-1, N - 1)), draft_q=q if sampled else None, chain=True)
            walk = make_tree(tokens, list(range(-1, N - 1)), draft_q=q if sampled else None)
            a = verify_sampling(fast, probs, u, u_bonus, sampled, max_depth=N - 1)
            b = verify_sampling(walk, probs, u, u_bonus, sampled, max_depth=N - 1)
            assert torch.equal(a.path, b.path) and torch.equal(a.n_accepted, b.n_accepted)
            assert torch.equal(a.bonus, b.bonus) and torch.equal(a.bonus_p, b.bonus_p)
            assert 0 < a.n_accepted.float().mean() < N - 1  # both acceptances and rejections happened


@pytest.mark.parametrize("sampled", [False, True], ids=["topk_children", "sampled_children"])
def test_the_oracle_detects_a_verifier_without_residual_update(sampled, monkeypatch):
    """Same acceptance test (p, or p/q), but rejected candidates stay in p: a classic lossy bug."""
    real = verify._try_candidate

    def no_residual_update(p, q, x, u):
        accept, _, _ = real(p, q, x, u)
        return accept, p, q

    monkeypatch.setattr(verify, "_try_candidate", no_residual_update)
    target, draft = tables(10)
    stat, dof, p_value = fit(target, lookup(target), draft, sampled, seed=11, rows=BROKEN_ROWS)
    assert p_value < 1e-30 and stat > 10 * dof, (stat, dof, p_value)


@pytest.mark.parametrize("sampled", [False, True], ids=["topk_children", "sampled_children"])
def test_speculative_sampling_with_temperature_top_k_top_p(sampled):
    """The target is process_logits(logits): sparse (zeros from top-k/top-p). The draft is sparse too (top-2),
    so the root's third sampled child has q = 0 and exercises the degenerate-q rule."""
    g = torch.Generator().manual_seed(20)
    target_logits = torch.randn(V, V, V, generator=g)
    draft_logits = target_logits + torch.randn(V, V, V, generator=g)
    settings = dict(temperature=0.8, top_k=5, top_p=0.95)
    target = process_logits(target_logits, **settings)  # the exact target of the test
    draft = process_logits(draft_logits, 1.0, top_k=2)

    def target_at(before, tokens):  # what the generation loop does: process the logits at every node
        return process_logits(target_logits[before, tokens], **settings)

    assert (target == 0).float().mean() > 1 / V  # top-p removes tokens beyond the one top-k removes
    assert (draft == 0).any()
    stat, dof, p_value = fit(target, target_at, draft, sampled, seed=21)
    assert p_value > P_VALUE_MIN, (stat, dof, p_value)


def test_verdict_fields():
    v = Verdict(path=torch.zeros(1, 1, dtype=torch.long), n_accepted=torch.zeros(1, dtype=torch.long),
                bonus=torch.zeros(1, dtype=torch.long))
    assert v.path.shape == (1, 1)


def test_bonus_p_is_the_probability_the_bonus_was_drawn_with():
    """A one-node (paused) step: p(bonus) under the target's distribution; after a rejected candidate: under the
    residual it was drawn from; greedy verdicts carry none."""
    g = torch.Generator().manual_seed(13)
    B, V = 40, 7
    probs = torch.softmax(torch.randn(B, 2, V, generator=g), -1)
    root = verify_sampling(make_tree(torch.zeros(B, 1), [-1]), probs[:, :1], torch.rand(B, 1, generator=g),
                           torch.rand(B, generator=g), False)
    torch.testing.assert_close(root.bonus_p, probs[:, 0].gather(1, root.bonus[:, None])[:, 0])
    x = probs[:, 0].argmin(-1)  # a deterministic candidate with u = 1 - eps: always rejected
    v = verify_sampling(make_tree(torch.stack([torch.zeros(B, dtype=torch.long), x], 1), [-1, 0]), probs,
                        torch.full((B, 2), 1 - 1e-7), torch.rand(B, generator=g), False)
    assert (v.n_accepted == 0).all() and (v.bonus != x).all()
    p0 = probs[:, 0]
    want = p0.gather(1, v.bonus[:, None])[:, 0] / (1 - p0.gather(1, x[:, None])[:, 0])
    torch.testing.assert_close(v.bonus_p, want)
    assert verify_greedy(make_tree(torch.zeros(B, 1), [-1]), probs[:, :1]).bonus_p is None
