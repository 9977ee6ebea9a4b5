"""Tree strategies own their kind: options, validation, node count, depth bound, label and drafting; the
dispatcher by batch size holds them. A scripted drafter (no neural net) checks what each strategy drafts."""

import pytest
import torch

from eaglespec.spec.speculative import DraftOptions
from eaglespec.spec.strategies import (
    DEFAULT_TREE_TABLE,
    TREE_KINDS,
    Chain,
    DynamicTree,
    NoDraft,
    StaticTree,
    TreeDispatcher,
    tree_from_dict,
)
from eaglespec.spec.tree import EAGLE1_TREE_PATHS


class ScriptedDrafter:
    """Children of a node whose feature is f are tokens 10 * f + r (r = rank), log-prob -(r + 1) / 4; the
    feature of an expanded node is its token. Records every expand() call."""

    def __init__(self, batch: int):
        self.batch, self.expands = batch, []

    def root_features(self):
        return torch.zeros(self.batch, 1, 1)

    def children(self, h, k):
        ids = (h[..., :1].long() * 10 + torch.arange(k)).long()  # [B, K, k]
        return ids, -(torch.arange(k, dtype=torch.float32) + 1).expand_as(ids) / 4, None

    def expand(self, parent_h, tokens, depth, mask):
        assert mask.shape[:2] == tokens.shape and mask.shape[2] >= tokens.shape[1]
        self.expands.append((depth, tokens.shape[1]))
        return tokens[..., None].float()


@pytest.mark.parametrize("strategy", [Chain(1), Chain(3), StaticTree(), StaticTree([[0], [1], [0, 0], [0, 1], [1, 0]]),
                                      DynamicTree(topk=2, depth=3, tree_tokens=5), NoDraft()],
                         ids=lambda s: s.label)
def test_the_drafted_tree_is_what_the_strategy_says(strategy):
    drafter = ScriptedDrafter(batch=2)
    tree, node_slot = strategy.draft(drafter, torch.tensor([7, 8]))
    tree.validate()
    assert tree.num_nodes == strategy.num_nodes
    if strategy.label in ("chain1", "none"):  # nothing expanded: no drafted pair for commit to keep
        assert node_slot is None
    else:
        assert node_slot.shape == (2, strategy.num_nodes)
    assert tree.max_depth == strategy.max_depth >= int(tree.depth.max())  # a bound (a dynamic rerank may
    assert isinstance(strategy, DynamicTree) or strategy.max_depth == int(tree.depth.max())  # keep it shallower)
    assert tree.tokens[:, 0].tolist() == [7, 8]
    assert len(drafter.expands) == max(strategy.max_depth - 1, 0)  # one draft forward per level below the root's


def test_a_chain_is_the_static_tree_of_one_path():
    chain = Chain(3)
    assert chain.paths == ((0,), (0, 0), (0, 0, 0)) and isinstance(chain, StaticTree)
    tree, node_slot = chain.draft(ScriptedDrafter(batch=1), torch.tensor([5]))
    assert tree.tokens.tolist() == [[5, 0, 0, 0]] and tree.parents.tolist() == [[-1, 0, 1, 2]]
    assert node_slot.tolist() == [[-1, 0, 1, -1]]  # nodes 1 and 2 were expanded (their pairs drafted), 3 is a leaf
    ref, _ = StaticTree(chain.paths).draft(ScriptedDrafter(batch=1), torch.tensor([5]))
    for name in ("tokens", "parents", "depth", "valid", "draft_logp"):
        assert torch.equal(getattr(tree, name), getattr(ref, name))


class RandomDrafter:
    """Seeded random children (tokens, log-probs and, when ``sampled``, the distribution q [B, K, V] they were
    drawn from); an expanded node's feature is its token. Two drafters with one seed draft the same."""

    def __init__(self, batch: int, seed: int, sampled: bool, vocab: int = 50):
        self.batch, self.sampled, self.vocab = batch, sampled, vocab
        self.g = torch.Generator().manual_seed(seed)

    def root_features(self):
        return torch.zeros(self.batch, 1, 1)

    def children(self, h, k):
        B, K = h.shape[:2]
        ids = torch.randint(0, self.vocab, (B, K, k), generator=self.g)
        q = torch.rand(B, K, self.vocab, generator=self.g).softmax(-1) if self.sampled else None
        return ids, -torch.rand(B, K, k, generator=self.g), q

    def expand(self, parent_h, tokens, depth, mask):
        return tokens[..., None].float()


@pytest.mark.parametrize("depth", [1, 2, 4])
@pytest.mark.parametrize("sampled", [False, True])
def test_a_chain_drafts_what_the_general_static_tree_assembles(depth, sampled):
    tree, slot = Chain(depth).draft(RandomDrafter(3, depth, sampled), torch.tensor([5, 6, 7]))
    ref, ref_slot = StaticTree(Chain(depth).paths).draft(RandomDrafter(3, depth, sampled), torch.tensor([5, 6, 7]))
    tree.validate()
    for name in ("tokens", "parents", "depth", "valid", "draft_logp"):
        assert torch.equal(getattr(tree, name), getattr(ref, name)), name
    assert (tree.draft_q is None) == (not sampled) and (not sampled or torch.equal(tree.draft_q, ref.draft_q))
    assert (slot is None and ref_slot is None) or torch.equal(slot, ref_slot)
    assert tree.chain and ref.chain and tree.max_depth == ref.max_depth == depth


def test_labels_sizes_and_depths():
    assert [(s.label, s.num_nodes, s.max_depth) for s in (
        Chain(2), StaticTree(), DynamicTree(topk=4, depth=5, tree_tokens=16), NoDraft())] == [
        ("chain2", 3, 2), ("static26", 26, 5), ("dynamic5x4:16", 17, 5), ("none", 1, 0)]
    assert not NoDraft().drafts and all(c.drafts for k, c in TREE_KINDS.items() if k != "none")
    assert not DynamicTree.samples_children and Chain.samples_children and StaticTree.samples_children


def test_no_draft_is_the_root_alone():
    tree, node_slot = NoDraft().draft(None, torch.tensor([3, 4]))
    assert tree.tokens.tolist() == [[3], [4]] and tree.max_depth == 0 and node_slot is None


@pytest.mark.parametrize("opts, expected", [
    (DraftOptions(tree="chain"), Chain(4)),
    (DraftOptions(tree="chain", depth=2), Chain(2)),
    (DraftOptions(tree="static"), StaticTree(EAGLE1_TREE_PATHS)),
    (DraftOptions(tree="static", tree_paths="[[0],[1],[0,0]]"), StaticTree([[0], [1], [0, 0]])),
    (DraftOptions(tree="dynamic", depth=3), DynamicTree(topk=4, depth=3, tree_tokens=16)),
    (DraftOptions(tree="none"), NoDraft()),
])
def test_options_build_the_strategy(opts, expected):
    assert opts.dispatcher().pick(1) == expected


@pytest.mark.parametrize("opts, message", [
    (DraftOptions(tree="chain", topk=3), "--topk do(es) not apply to a chain tree"),
    (DraftOptions(tree="static", depth=3), "--depth do(es) not apply to a static tree"),
    (DraftOptions(tree="dynamic", tree_paths="[[0]]"), "--tree-paths do(es) not apply to a dynamic tree"),
    (DraftOptions(tree="none", depth=1), "--depth do(es) not apply to a none tree"),
    (DraftOptions(tree="auto", depth=1), "need an explicit --tree"),
    (DraftOptions(tree="static", tree_paths="[[0],"), "not valid JSON"),
    (DraftOptions(tree="chain", depth=0), "chain depth must be an int >= 1"),
    (DraftOptions(tree="bush"), "--tree must be"),
])
def test_options_that_do_not_apply_are_refused_by_name(opts, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        opts.dispatcher()


# ---------------------------------------------------------------- dispatcher


def test_dispatcher_picks_configured_trees():
    dyn = DynamicTree(topk=4, depth=3, tree_tokens=12)
    static = StaticTree([[0], [1], [0, 0]])
    chain = Chain(3)
    d = TreeDispatcher.from_table({1: dyn, 2: static, 4: chain})
    assert [d.pick(n) for n in (1, 2, 3, 4, 5, 1000)] == [dyn, static, static, chain, chain, chain]
    assert static.shape.num_nodes == 4 and chain.shape.depths == (0, 1, 2, 3)
    assert dyn.num_nodes == 13
    with pytest.raises(ValueError):
        d.pick(0)


def test_dispatcher_from_plain_data():
    d = TreeDispatcher.from_table([
        ("1", {"kind": "static", "paths": [[0], [1], [0, 0]]}),
        (3, {"kind": "chain", "depth": 2}),
    ])
    assert d.pick(2) == StaticTree([[0], [1], [0, 0]]) and d.pick(2).max_depth == 2
    assert d.pick(3) == Chain(2)
    assert tree_from_dict({"kind": "none"}) == NoDraft()


@pytest.mark.parametrize("table, message", [
    ({}, "at least one"),
    ({2: Chain(3)}, "batch size 1"),
    ([(1, Chain(3)), (4, Chain(2)), (2, Chain(1))], "increasing"),
    ([(1, Chain(3)), (1, Chain(2))], "increasing"),
    ({0: Chain(3)}, ">= 1"),
    ({1: "chain3"}, "TreeStrategy"),
    ({1: {"kind": "tree"}}, "kind"),
    ({1: {"kind": "chain", "depth": 0}}, "depth"),
    ({1: {"kind": "static", "paths": [[0, 0]]}}, "missing"),
    ({1: {"kind": "dynamic", "topk": 2, "depth": 2, "tree_tokens": 9}}, "exceeds"),
    ({1: {"kind": "chain", "depth": 2, "width": 3}}, "unknown"),
    ({1: {"kind": "none", "depth": 2}}, "unknown keys for a none tree"),
])
def test_dispatcher_rejects_bad_tables(table, message):
    with pytest.raises(ValueError, match=message):
        TreeDispatcher.from_table(table)


def test_default_table_is_valid():
    d = TreeDispatcher(DEFAULT_TREE_TABLE)
    assert d.pick(1).num_nodes >= 2  # batch 1 drafts; larger batches may pause speculation (NoDraft)
    for n in (1, 2, 3, 4, 64):
        cfg = d.pick(n)
        tree, _ = cfg.draft(ScriptedDrafter(batch=n), torch.zeros(n, dtype=torch.long))
        assert tree.num_nodes == cfg.num_nodes
