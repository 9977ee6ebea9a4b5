"""Oracles for eaglespec.spec.tree: hand-written masks, paths and selections; a brute-force rerank check."""

import pytest
import torch

from eaglespec.spec.tree import (
    EAGLE1_TREE_PATHS,
    DraftTree,
    DynamicTreeBuilder,
    expand_static,
    leaf_paths,
    static_shape,
    tree_mask,
    tree_positions,
)

INF = float("inf")

# The 7-node tree used throughout:      0
#                                      / \
#                                     1   2
#                                    / \   \
#                                   3   4   5
#                                   |
#                                   6
PARENTS7 = [-1, 0, 0, 1, 1, 2, 3]
DEPTH7 = [0, 1, 1, 2, 2, 2, 3]
MASK7 = [
    [1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 0, 0],
    [1, 1, 0, 1, 0, 0, 0],
    [1, 1, 0, 0, 1, 0, 0],
    [1, 0, 1, 0, 0, 1, 0],
    [1, 1, 0, 1, 0, 0, 1],
]


def t(x, dtype=torch.int64):
    return torch.tensor(x, dtype=dtype)


def all_valid(parents):
    return torch.ones_like(parents, dtype=torch.bool)


# ---------------------------------------------------------------- buffers


def test_mask_chain4():
    parents = t([[-1, 0, 1, 2]])
    expected = t([[[1, 0, 0, 0],
                   [1, 1, 0, 0],
                   [1, 1, 1, 0],
                   [1, 1, 1, 1]]], torch.bool)
    assert torch.equal(tree_mask(parents, all_valid(parents)), expected)


def test_mask_tree7():
    parents = t([PARENTS7])
    assert torch.equal(tree_mask(parents, all_valid(parents)), t([MASK7], torch.bool))


def test_mask_single_root():
    assert torch.equal(tree_mask(t([[-1]]), t([[True]], torch.bool)), t([[[True]]], torch.bool))


def test_mask_padding_and_batch():
    # row 1: the 7-node tree; row 2: nodes 0..4 of it, nodes 5 and 6 padding (seen by nobody, see only self)
    parents = t([PARENTS7, [-1, 0, 0, 1, 1, -1, -1]])
    valid = t([[1] * 7, [1, 1, 1, 1, 1, 0, 0]], torch.bool)
    row2 = [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],
    ]
    assert torch.equal(tree_mask(parents, valid), t([MASK7, row2], torch.bool))


def test_mask_deep_chain_needs_all_rounds():
    # depth 9 chain: pointer jumping must reach the root from the last node
    parents = torch.arange(-1, 9)[None]
    assert torch.equal(tree_mask(parents, all_valid(parents))[0], torch.tril(torch.ones(10, 10, dtype=torch.bool)))


def test_positions():
    depth = t([DEPTH7, [0, 1, 1, 2, 2, 0, 0]])
    expected = t([[5, 6, 6, 7, 7, 7, 8], [12, 13, 13, 14, 14, 12, 12]])
    assert torch.equal(tree_positions(depth, t([5, 12])), expected)


def test_leaf_paths_tree7_and_padding():
    parents = t([PARENTS7, [-1, 0, 0, 1, 1, -1, -1]])
    valid = t([[1] * 7, [1, 1, 1, 1, 1, 0, 0]], torch.bool)
    expected = t([
        [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]],  # leaves 4, 5, 6
        [[0, 2, -1, -1], [0, 1, 3, -1], [0, 1, 4, -1]],  # leaves 2, 3, 4
    ])
    assert torch.equal(leaf_paths(parents, valid), expected)
    # static-size hints: same content, padded to the requested L and D+1
    hinted = leaf_paths(parents, valid, max_leaves=4, max_depth=4)
    assert hinted.shape == (2, 4, 5)
    assert torch.equal(hinted[:, :3, :4], expected)
    assert (hinted[:, 3] == -1).all() and (hinted[:, :, 4] == -1).all()


def test_leaf_paths_chain4_and_root_only():
    parents = t([[-1, 0, 1, 2]])
    assert torch.equal(leaf_paths(parents, all_valid(parents)), t([[[0, 1, 2, 3]]]))
    assert torch.equal(leaf_paths(t([[-1]]), t([[True]], torch.bool)), t([[[0]]]))


def test_validate_catches_broken_trees():
    def tree(parents, depth, valid=None):
        p = t([parents])
        return DraftTree(tokens=torch.zeros_like(p), parents=p, depth=t([depth]),
                         valid=all_valid(p) if valid is None else t([valid], torch.bool),
                         draft_logp=torch.zeros(p.shape))

    tree(PARENTS7, DEPTH7).validate()
    with pytest.raises(ValueError, match="earlier node"):
        tree([-1, 2, 0], [0, 2, 1]).validate()  # child before its parent
    with pytest.raises(ValueError, match="depth"):
        tree([-1, 0, 1], [0, 1, 1]).validate()
    with pytest.raises(ValueError, match="root"):
        tree([0, 0, 1], [0, 1, 2]).validate()
    with pytest.raises(ValueError, match="padding"):
        tree([-1, 0, 1], [0, 1, 2], valid=[1, 0, 1]).validate()  # valid node below a padding node


# ---------------------------------------------------------------- static shapes


def test_eagle1_preset():
    shape = static_shape(EAGLE1_TREE_PATHS)
    assert len(EAGLE1_TREE_PATHS) == 25
    assert shape.num_nodes == 26
    assert shape.depth_counts == (1, 4, 8, 8, 3, 2)
    assert shape.max_depth == 5
    # nodes ordered by depth, then parent, then rank; parents before children
    assert all(shape.parents[i] < i for i in range(1, 26))
    assert shape.paths[:5] == ((), (0,), (1,), (2,), (3,))
    assert [(lv.expanded, lv.topk) for lv in shape.levels] == [
        ((0,), 4), ((1, 2, 3, 4), 3), ((5, 6, 7, 8), 3), ((13,), 3), ((21,), 2)]
    # leaves by hand: depth 2: [1,1] [2,0] [2,1] [3,0]; depth 3: all but [0,0,0] (7); depth 4: 2; depth 5: 2
    assert shape.max_leaves == 15 and shape.max_children == 4
    parents = shape.parents_tensor()[None]
    paths = leaf_paths(parents, all_valid(parents), max_leaves=shape.max_leaves, max_depth=shape.max_depth)
    assert paths.shape == (1, 15, 6)
    assert paths[0, -1].tolist() == [0, 1, 5, 13, 21, 25]  # the deepest path, [0, 0, 0, 0, 1]
    assert shape.paths[25] == (0, 0, 0, 0, 1)


def test_small_static_shape_compiled_by_hand():
    shape = static_shape([[1, 0], [0], [0, 1], [1], [0, 0]])  # order of input must not matter
    assert shape.paths == ((), (0,), (1,), (0, 0), (0, 1), (1, 0))
    assert shape.parents == (-1, 0, 0, 1, 1, 2)
    assert shape.ranks == (-1, 0, 1, 0, 1, 0)
    assert shape.depths == (0, 1, 1, 2, 2, 2)
    lv0, lv1 = shape.levels
    assert (lv0.expanded, lv0.topk, lv0.children, lv0.child_slot, lv0.child_rank) == ((0,), 2, (1, 2), (0, 0), (0, 1))
    assert (lv1.expanded, lv1.parent_slot, lv1.rank, lv1.topk) == ((1, 2), (0, 0), (0, 1), 2)
    assert (lv1.children, lv1.child_slot, lv1.child_rank) == ((3, 4, 5), (0, 0, 1), (0, 1, 0))


@pytest.mark.parametrize("paths, message", [
    ([], "non-empty"),
    ([[0], [0, 0], [0]], "twice"),
    ([[0], [1, 0]], "prefix \\[1\\] is missing"),
    ([[0], [0, 0, 1]], "prefix \\[0, 0\\] is missing"),
    ([[0], []], "non-empty"),
    ([[-1]], "non-negative"),
    ([[0.5]], "non-negative"),
    ("01", "non-empty"),
])
def test_invalid_paths_refused(paths, message):
    with pytest.raises(ValueError, match=message):
        static_shape(paths)


def test_expand_static_by_hand():
    shape = static_shape([[0], [1], [0, 0], [0, 1], [1, 0]])
    # level 0: root's top-3 (one more column than needed: must be ignored)
    tok0 = t([[[10, 11, 99]], [[20, 21, 99]]])
    lp0 = torch.tensor([[[-0.1, -0.2, -9.0]], [[-0.3, -0.4, -9.0]]])
    # level 1: top-2 of the expanded nodes 1 and 2
    tok1 = t([[[12, 13], [14, 15]], [[22, 23], [24, 25]]])
    lp1 = torch.tensor([[[-1.0, -2.0], [-3.0, -4.0]], [[-5.0, -6.0], [-7.0, -8.0]]])
    tree = expand_static(shape, t([1, 2]), [tok0, tok1], [lp0, lp1])
    tree.validate()
    assert torch.equal(tree.tokens, t([[1, 10, 11, 12, 13, 14], [2, 20, 21, 22, 23, 24]]))
    assert torch.allclose(tree.draft_logp, torch.tensor([[0, -0.1, -0.2, -1, -2, -3], [0, -0.3, -0.4, -5, -6, -7]]))
    assert torch.equal(tree.parents, t([[-1, 0, 0, 1, 1, 2]] * 2))
    assert torch.equal(tree.depth, t([[0, 1, 1, 2, 2, 2]] * 2))
    assert tree.valid.all() and tree.draft_q is None
    with pytest.raises(ValueError, match="level 1"):
        expand_static(shape, t([1, 2]), [tok0, tok1[:, :1]], [lp0, lp1])


# ---------------------------------------------------------------- dynamic tree


def run_builder(builder, root, levels):
    """levels: per level (child_tokens [B, K, topk], child_logp [B, K, topk]) as nested lists."""
    frontiers = [builder.root(t(root))]
    for tok, lp in levels:
        frontiers.append(builder.add_level(t(tok), torch.tensor(lp)))
    return builder.build(), frontiers


# Row 0 and row 1 of a topk=2, depth=3 example; scores worked out by hand in the comments.
ROW0 = [
    ([[10, 11]], [[-0.5, -1.0]]),                    # 10: -0.5, 11: -1.0
    ([[20, 21], [22, 23]], [[-0.25, -2.0], [-0.1, -3.0]]),  # 20: -0.75, 21: -2.5, 22: -1.1, 23: -4.0
    ([[30, 31], [32, 33]], [[-0.5, -1.5], [-0.05, -2.0]]),  # children of 20: 30 -1.25, 31 -2.25;
]                                                         # of 22: 32 -1.15, 33 -3.1
ROW1 = [
    ([[10, 11]], [[-0.1, -0.2]]),                    # 10: -0.1, 11: -0.2
    ([[20, 21], [22, 23]], [[-1.0, -1.2], [-0.05, -0.3]]),  # 20: -1.1, 21: -1.3, 22: -0.25, 23: -0.5
    ([[40, 41], [42, 43]], [[-0.1, -2.0], [-0.1, -0.2]]),   # children of 22: 40 -0.35, 41 -2.25;
]                                                         # of 23: 42 -0.6, 43 -0.7


def batch(*rows):
    """Stack rows given per level as ([K, topk] tokens, [K, topk] logp) into batched levels."""
    return [tuple([r[i][j] for r in rows] for j in range(2)) for i in range(len(rows[0]))]


def test_dynamic_hand_example_single_row():
    # all scores: 10 -.5, 20 -.75, 11 -1, 22 -1.1, 32 -1.15, 30 -1.25, 31 -2.25, 21 -2.5, 33 -3.1, 23 -4
    # the 5 best: 10, 20, 11, 22, 32; output by depth then score
    tree, fr = run_builder(DynamicTreeBuilder(topk=2, depth=3, tree_tokens=5), [100], batch(ROW0))
    tree.validate()
    assert tree.tokens.tolist() == [[100, 10, 11, 20, 22, 32]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 2, 4]]
    assert tree.depth.tolist() == [[0, 1, 1, 2, 2, 3]]
    assert tree.valid.all()
    assert torch.allclose(tree.draft_logp, torch.tensor([[0, -0.5, -1.0, -0.25, -0.1, -0.05]]))
    # frontier after level 2 = the 2 best level-2 candidates: 20 (child of slot 0) and 22 (child of slot 1)
    assert fr[2].tokens.tolist() == [[20, 22]] and fr[2].parent_slot.tolist() == [[0, 1]]
    assert torch.allclose(fr[2].scores, torch.tensor([[-0.75, -1.1]]))
    # processed nodes: root, 10, 11, 20, 22
    assert fr[2].mask.int().tolist() == [[[1, 1, 0, 1, 0], [1, 0, 1, 0, 1]]]
    assert fr[1].mask.int().tolist() == [[[1, 1, 0], [1, 0, 1]]]
    assert fr[0].mask.int().tolist() == [[[1]]] and fr[0].depth == 0 and fr[3].depth == 3


def test_dynamic_batch_rows_differ():
    # row 1 scores: 10 -.1, 11 -.2, 22 -.25, 40 -.35, 23 -.5, 42 -.6, 43 -.7, 20 -1.1, 21 -1.3, 41 -2.25
    # the 5 best: 10, 11, 22, 40, 23
    tree, fr = run_builder(DynamicTreeBuilder(topk=2, depth=3, tree_tokens=5), [100, 200], batch(ROW0, ROW1))
    tree.validate()
    assert tree.tokens.tolist() == [[100, 10, 11, 20, 22, 32], [200, 10, 11, 22, 23, 40]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 2, 4], [-1, 0, 0, 2, 2, 3]]
    assert tree.depth.tolist() == [[0, 1, 1, 2, 2, 3], [0, 1, 1, 2, 2, 3]]
    assert fr[2].tokens.tolist() == [[20, 22], [22, 23]]
    assert fr[2].parent_slot.tolist() == [[0, 1], [1, 1]]
    assert fr[2].mask.int().tolist()[1] == [[1, 0, 1, 1, 0], [1, 0, 1, 0, 1]]


def test_dynamic_tie_never_drops_parent():
    # child 20 has logp 0: it ties with its parent 10 (-0.5); with room for one node the parent must win
    levels = [([[10, 11]], [[-0.5, -1.0]]), ([[20, 21], [22, 23]], [[0.0, -2.0], [-0.1, -3.0]])]
    for tree_tokens, expected in [(1, [100, 10]), (2, [100, 10, 20]), (3, [100, 10, 11, 20])]:
        tree, _ = run_builder(DynamicTreeBuilder(topk=2, depth=2, tree_tokens=tree_tokens), [100], batch(levels))
        tree.validate()
        assert tree.tokens.tolist() == [expected], tree_tokens
    # a whole chain of logp 0 children: all tie with the root's child; depth order decides
    levels = [([[10, 11]], [[-0.5, -0.5]]), ([[20, 21], [22, 23]], [[0.0, 0.0], [0.0, 0.0]])]
    tree, _ = run_builder(DynamicTreeBuilder(topk=2, depth=2, tree_tokens=3), [100], batch(levels))
    tree.validate()
    assert tree.tokens.tolist() == [[100, 10, 11, 20]]
    # a (bogus) positive logp is clamped: the child cannot overtake its parent
    levels = [([[10, 11]], [[-0.5, -1.0]]), ([[20, 21], [22, 23]], [[0.3, -2.0], [-0.1, -3.0]])]
    tree, _ = run_builder(DynamicTreeBuilder(topk=2, depth=2, tree_tokens=1), [100], batch(levels))
    assert tree.tokens.tolist() == [[100, 10]]


def test_dynamic_forbidden_children_pad_the_row():
    # row 1 forbids token 11 (logp -inf): its subtree is never kept and the row is padded at the end
    levels = [
        ([[10, 11]], [[-0.5, -INF]]),
        ([[20, 21], [22, 23]], [[-0.5, -1.0], [-0.1, -0.2]]),  # children of 10 (slot 0) and 11 (slot 1)
    ]
    tree, _ = run_builder(DynamicTreeBuilder(topk=2, depth=2, tree_tokens=4), [100], batch(levels))
    tree.validate()
    assert tree.valid.tolist() == [[True, True, True, True, False]]
    assert tree.tokens.tolist() == [[100, 10, 20, 21, 0]]
    assert tree.parents.tolist() == [[-1, 0, 1, 1, -1]]
    assert leaf_paths(tree.parents, tree.valid).tolist() == [[[0, 1, 2], [0, 1, 3]]]


def brute_force_keep(root_tok, levels, topk, tree_tokens):
    """Plain-Python EAGLE-2 oracle for one row: returns the set of kept (token path) tuples."""
    cands = []  # (score, creation, path)
    frontier = [(0.0, (root_tok,))]
    for tok, lp in levels:
        level = []
        for k, (pscore, ppath) in enumerate(frontier):
            for r in range(topk):
                level.append((pscore + min(lp[k][r], 0.0), ppath + (tok[k][r],)))
        for s, p in level:
            cands.append((s, len(cands), p))
        frontier = sorted(level, key=lambda c: -c[0])[:topk]  # sorted() is stable
    kept = sorted(cands, key=lambda c: (-c[0], c[1]))[:tree_tokens]
    return {c[2] for c in kept}


def test_dynamic_matches_brute_force_on_random_rows():
    gen = torch.Generator().manual_seed(0)
    topk, depth, tree_tokens, B = 3, 4, 10, 4
    builder = DynamicTreeBuilder(topk, depth, tree_tokens)
    root = torch.arange(B) + 1000
    frontier = builder.root(root)
    raw = []
    next_token = 1
    for _ in range(depth):
        K = frontier.tokens.shape[1]
        # unique tokens per candidate so paths identify nodes; log-probs rounded to create some ties
        tok = torch.arange(next_token, next_token + B * K * topk).reshape(B, K, topk)
        next_token += B * K * topk
        lp = -torch.round(torch.rand(B, K, topk, generator=gen) * 8) / 4
        raw.append((tok, lp))
        frontier = builder.add_level(tok, lp)
    tree = builder.build()
    tree.validate()
    for b in range(B):
        levels = [(tok[b].tolist(), lp[b].tolist()) for tok, lp in raw]
        expected = brute_force_keep(int(root[b]), levels, topk, tree_tokens)
        got = set()
        for i in range(1, tree.num_nodes):
            path, j = [], i
            while j >= 0:
                path.append(int(tree.tokens[b, j]))
                j = int(tree.parents[b, j])
            got.add(tuple(reversed(path)))
        assert got == expected, b
        # siblings in descending draft log-prob (the order a verifier tries them in)
        parents, valid = tree.parents[b].tolist(), tree.valid[b].tolist()
        for node in range(tree.num_nodes):
            lps = [float(tree.draft_logp[b, c]) for c in range(tree.num_nodes) if valid[c] and parents[c] == node]
            assert lps == sorted(lps, reverse=True)


def test_dynamic_builder_misuse():
    with pytest.raises(ValueError, match="exceeds"):
        DynamicTreeBuilder(topk=2, depth=2, tree_tokens=7)  # only 2 + 4 candidates
    with pytest.raises(ValueError):
        DynamicTreeBuilder(topk=0, depth=2, tree_tokens=1)
    b = DynamicTreeBuilder(topk=2, depth=1, tree_tokens=2)
    with pytest.raises(RuntimeError):
        b.add_level(t([[[1, 2]]]), torch.zeros(1, 1, 2))
    b.root(t([5]))
    with pytest.raises(ValueError, match="shape"):
        b.add_level(t([[[1, 2, 3]]]), torch.zeros(1, 1, 3))
    with pytest.raises(RuntimeError):
        b.build()
    b.add_level(t([[[1, 2]]]), torch.log(torch.tensor([[[0.7, 0.2]]])))
    with pytest.raises(RuntimeError):
        b.add_level(t([[[1, 2], [3, 4]]]), torch.zeros(1, 2, 2))
    assert b.build().tokens.tolist() == [[5, 1, 2]]


def test_root_only_and_select():
    root = DraftTree.root_only(t([[5], [6], [7]]))
    root.validate()
    assert root.num_nodes == 1 and root.tokens.tolist() == [[5], [6], [7]] and root.parents.tolist() == [[-1]] * 3
    assert torch.equal(DraftTree.root_only(t([5, 6, 7])).tokens, root.tokens)
    tree, _ = run_builder(DynamicTreeBuilder(topk=2, depth=3, tree_tokens=5), [100, 200], batch(ROW0, ROW1))
    sub = tree.select(t([1]))
    sub.validate()
    assert sub.tokens.tolist() == [[200, 10, 11, 22, 23, 40]] and sub.draft_q is None


def test_a_chain_is_flagged_and_its_ancestor_mask_is_causal():
    """The engine verifies a flagged chain without a block mask (causal within the block): that is only right
    if a chain's ancestor-or-self mask is lower-triangular, and only chains may carry the flag."""
    for paths, chain in (([(0,), (0, 0), (0, 0, 0)], True), ([(0,)], True), ([(0,), (1,)], False),
                         (EAGLE1_TREE_PATHS, False)):
        shape = static_shape(paths)
        assert shape.is_chain == chain
        levels = [(torch.zeros(2, len(lv.expanded), lv.topk, dtype=torch.long),
                   torch.zeros(2, len(lv.expanded), lv.topk)) for lv in shape.levels]
        tree = expand_static(shape, torch.tensor([1, 2]), [t for t, _ in levels], [lp for _, lp in levels])
        assert tree.chain == chain
        if chain:
            n = shape.num_nodes
            assert torch.equal(tree_mask(tree.parents, tree.valid), torch.ones(n, n, dtype=torch.bool).tril().expand(2, n, n))
