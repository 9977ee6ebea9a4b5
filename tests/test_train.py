"""Draft-head training on a tiny random target (hidden 64, 4 layers, CPU, one thread, seeded): the TTT unroll
against the head's own cached drafting, captured features against the runtime, the pipeline learning
(self-distilled data -> capture -> train -> acceptance through the engine), resume after SIGKILL, a
2-process data-parallel step against the single-process step, strict save/load, configuration."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eaglespec.datasets import DatasetError, encode_conversation
from eaglespec.train.data import PrepareConfig, prepare_data, read_prepared
from eaglespec.train.features import FeatureStore, OfflineFeatures, OnlineFeatures, capture_features, epoch_batches
from eaglespec.spec.heads import DraftHead, default_feature_layer_ids, load_head, save_head
from eaglespec.train.train import TrainConfig, TTTUnroll, select_draft_vocab, split_indices, train
from helpers import tiny_target

REPO = Path(__file__).resolve().parents[1]
LAYERS = 4
IDS = default_feature_layer_ids(LAYERS)
WORDS = ["fox", "dog", "cat", "one", "two", "add", "sum", "tree", "draft", "token"]


def proposer_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("eaglespec.spec.proposer") is not None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny target (also saved as an HF directory for subprocesses), self-distilled data and its features."""
    root = tmp_path_factory.mktemp("tiny")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is faster, and stable on a shared machine
    target, hf = tiny_target(num_hidden_layers=LAYERS)
    hf.save_pretrained(root / "model")
    target.tokenizer.save_pretrained(root / "model")
    rng = random.Random(0)
    prompts = [{"prompt": "Say " + " ".join(rng.choice(WORDS) for _ in range(5)), "response": "x"} for _ in range(96)]
    (root / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    prepare_data(PrepareConfig(inputs=[str(root / "train.jsonl")], output=str(root / "data"), max_len=128,
                               regenerate=True, regen_max_new_tokens=40, regen_batch_size=16), target)
    capture_features(target, root / "data", root / "feat", IDS, torch.float32, shard_records=32, batch_tokens=1024,
                     progress=False)
    torch.set_num_threads(threads)
    return target, root


def config(root: Path, out: str, **kw) -> TrainConfig:
    base = dict(features=str(root / "feat"), out_dir=str(root / out), draft_vocab_size=None, lr=3e-3,
                warmup_steps=10, batch_size=8, eval_records=16, eval_every=0, checkpoint_every=0,
                eval_acceptance_prompts=8, eval_max_new_tokens=32, threads=1, progress=False, log_every=50)
    base.update(kw)
    return TrainConfig(**base)


def random_head(target, kind: str, layers: int) -> DraftHead:
    torch.manual_seed(1)
    head = DraftHead.for_target(target, kind, num_layers=layers, draft_vocab_size=200 if kind == "eagle3" else None)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    if kind == "eagle3":
        head.set_draft_vocab(torch.randperm(target.args.vocab_size)[:200])
    return head


# ------------------------------------------------------------------------------------- TTT unroll
@pytest.mark.parametrize("kind,layers", [("eagle3", 1), ("eagle3", 2), ("eagle1", 1)])
def test_ttt_unroll_equals_cached_drafting(tiny, kind, layers):
    """Step 0 = the head over all pairs; step j at pair i = drafting j steps after a prefix of i+1 pairs."""
    target = tiny[0].model
    head = random_head(target, kind, layers)
    torch.manual_seed(2)
    batch, width, k = 2, 14, 3
    tokens = torch.randint(3, target.args.vocab_size, (batch, width))
    with torch.no_grad():
        out = target(tokens, torch.arange(width).expand(batch, width), target.new_cache(batch, width),
                     hidden_indices=head.hidden_indices)
        feats = head.target_feature(out)
        outs, logits = TTTUnroll(head, k)(feats, tokens)
        n = width - 1
        h = head.fuse(feats[:, :n])
        o0 = head(h, tokens[:, 1:], torch.arange(n).expand(batch, n), head.new_cache(batch, width + k))
        torch.testing.assert_close(outs[0], o0, rtol=1e-5, atol=1e-5)
        for i in (0, 5, n - k):
            cache = head.new_cache(batch, width + k)
            o = head(h[:, : i + 1], tokens[:, 1 : i + 2], torch.arange(i + 1).expand(batch, i + 1), cache)
            cache.advance(None, i + 1)
            x = o[:, -1:]
            for j in range(1, k):
                x = head(x, tokens[:, i + j + 1 : i + j + 2], torch.full((batch, 1), i + j), cache)
                cache.advance(None, 1)
                torch.testing.assert_close(outs[j][:, i], x[:, 0], rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(logits[j][:, i], head.logits(x)[:, 0], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ features
def test_captured_features_equal_the_runtime_and_manifest(tiny):
    target, root = tiny
    store = FeatureStore(root / "feat")
    records, data_manifest = read_prepared(root / "data")
    m = store.manifest
    assert m["hidden_indices"] == list(IDS) and m["feature_layer_convention"] == "hf_hidden_states_index"
    assert m["model"] == target.name and m["dtype"] == "float32" and m["complete"] and m["records"] == len(records)
    assert [s["file"] for s in m["shards"]] == ["shard-00000.safetensors", "shard-00001.safetensors",
                                                "shard-00002.safetensors"]
    assert m["data_sha256"] == data_manifest["data_sha256"] and len(store) == len(records)
    model = target.model
    for i in (0, 37, len(records) - 1):  # each record alone through the runtime: no batching, no padding
        ids = torch.tensor([records[i].input_ids])
        with torch.no_grad():
            out = model(ids, torch.arange(ids.shape[1])[None], model.new_cache(1, ids.shape[1]), hidden_indices=IDS)
            logits = torch.nn.functional.linear(out.hidden, model.lm_head_weight)
        rec = store.record(i)
        assert rec["input_ids"].tolist() == records[i].input_ids and rec["loss_mask"].tolist() == records[i].loss_mask
        torch.testing.assert_close(rec["hidden"], out.hidden[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rec["aux"], out.aux[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(rec["top1"].long(), logits[0].argmax(-1))

    # the online iterator yields the same batches as the offline reader
    idx = [3, 50, 7]
    off = OfflineFeatures(store, idx, 3).load(idx)
    on = OnlineFeatures(model, records, idx, 3, IDS).load(idx)
    for name in ("input_ids", "loss_mask", "lengths", "top1", "record_index"):
        assert torch.equal(getattr(off, name), getattr(on, name)), name
    for name in ("hidden", "aux"):
        torch.testing.assert_close(getattr(off, name), getattr(on, name), rtol=1e-5, atol=1e-5)


def test_capture_with_a_packed_target_stores_what_decoding_sees(tmp_path):
    """--dtype int4 (what `auto` gives a Q4 GGUF): features are the packed runtime's for each record alone,
    computed by the packed kernels as decoding computes them, and the manifest names the precision."""
    from eaglespec.runtime.pack import pack_model

    torch.manual_seed(0)
    target, _ = tiny_target("llama", seed=3, num_hidden_layers=LAYERS)
    pack_model(target.model, "int4")
    rng = random.Random(1)
    rows = [{"prompt": "Say " + " ".join(rng.choice(WORDS) for _ in range(6)), "response": "one two " * (k + 2)}
            for k in range(6)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare_data(PrepareConfig(inputs=[str(tmp_path / "train.jsonl")], output=str(tmp_path / "data"), max_len=64),
                 target)
    capture_features(target, tmp_path / "data", tmp_path / "feat", IDS, torch.float32, shard_records=4,
                     batch_tokens=256, progress=False)
    store = FeatureStore(tmp_path / "feat")
    assert store.manifest["compute_dtype"] == "int4"
    records, _ = read_prepared(tmp_path / "data")
    model = target.model
    for i in range(len(records)):
        ids = torch.tensor([records[i].input_ids])
        with torch.no_grad():
            out = model(ids, torch.arange(ids.shape[1])[None], model.new_cache(1, ids.shape[1]), hidden_indices=IDS)
        rec = store.record(i)
        torch.testing.assert_close(rec["hidden"], out.hidden[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rec["aux"], out.aux[0], rtol=1e-5, atol=1e-5)


def test_capture_resumes_by_skipping_finished_shards(tiny, tmp_path):
    target, root = tiny
    out = tmp_path / "feat"
    capture_features(target, root / "data", out, IDS, torch.bfloat16, shard_records=40, limit=90, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    first = {s["file"]: (out / s["file"]).stat().st_mtime_ns for s in manifest["shards"]}
    # simulate a kill before the last shard was listed: drop it from the manifest and the disk
    manifest["shards"] = manifest["shards"][:-1]
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "shard-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="incomplete"):
        FeatureStore(out)
    again = capture_features(target, root / "data", out, IDS, torch.bfloat16, shard_records=40, limit=90,
                             progress=False)
    assert again["complete"] and len(again["shards"]) == 3
    for name in ("shard-00000.safetensors", "shard-00001.safetensors"):
        assert (out / name).stat().st_mtime_ns == first[name]  # not rewritten
    store, full = FeatureStore(out), FeatureStore(root / "feat")
    assert store.manifest["dtype"] == "bfloat16"
    for i in (0, 45, 89):
        torch.testing.assert_close(store.record(i)["aux"], full.record(i)["aux"].bfloat16())
    with pytest.raises(ValueError, match="other settings"):
        capture_features(target, root / "data", out, (1, 3, 4), torch.bfloat16, shard_records=40, limit=90,
                         progress=False)


def test_batches_shard_the_global_batch_across_ranks():
    lengths = [random.Random(i).randint(5, 50) for i in range(40)]
    idx = list(range(40))
    single = epoch_batches(lengths, idx, 4, seed=3, epoch=1)
    ranks = [epoch_batches(lengths, idx, 2, seed=3, epoch=1, world_size=2, rank=r) for r in range(2)]
    assert len(single) == 10 and all(len(b) == 4 for b in single)
    for g, a, b in zip(single, *ranks):
        assert sorted(g) == sorted(a + b) and not set(a) & set(b)
    assert epoch_batches(lengths, idx, 4, seed=3, epoch=2) != single


def test_draft_vocab_selection():
    from collections import Counter

    counts = Counter({7: 5, 3: 5, 9: 1, 12: 8})
    assert select_draft_vocab(counts, 3, 20).tolist() == [3, 7, 12]  # most frequent, ties by id, sorted
    assert select_draft_vocab(counts, 3, 20, always=[2]).tolist() == [2, 3, 12]
    assert select_draft_vocab(counts, 6, 20).tolist() == [0, 1, 3, 7, 9, 12]  # filled with the lowest unused ids
    train_idx, eval_idx = split_indices(10, 3, seed=0)
    assert sorted(train_idx + eval_idx) == list(range(10)) and len(eval_idx) == 3


# ---------------------------------------------------------------------------------------- learning
def test_pipeline_learns_high_acceptance(tiny):
    target, root = tiny
    untrained = train(config(root, "untrained", max_steps=1, lr=1e-12, warmup_steps=0), target)
    trained = train(config(root, "eagle3", max_steps=200, eval_every=100, ttt_steps=3, draft_vocab_size=160),
                    target)
    assert max(untrained["eval_acc"]) < 0.15
    assert trained["eval_acc"][0] > 0.6 and min(trained["eval_acc"]) > 0.5, trained
    if proposer_available():
        assert untrained["tau"] < 1.2
        assert trained["tau"] > 1.8 and trained["acceptance_by_position"][0] > 0.5, trained
    head = load_head(root / "eagle3" / "head", target.model)  # strict load of the saved head
    assert head.config.draft_vocab_size == 160 and head.config.feature_layer_ids == IDS
    lines = [json.loads(x) for x in (root / "eagle3" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "eval_acc" in x] == [100, 200]


def test_eagle1_objective_learns(tiny):
    target, root = tiny
    summary = train(config(root, "eagle1", kind="eagle1", max_steps=120, ttt_steps=2, eval_acceptance_prompts=0),
                    target)
    assert summary["eval_acc"][0] > 0.5, summary
    head = load_head(root / "eagle1" / "head", target.model)
    assert head.config.kind == "eagle1" and head.config.bias


def test_saved_heads_load_strictly_and_round_trip(tiny, tmp_path):
    target, root = tiny
    cfg = config(root, "roundtrip", max_steps=30, checkpoint_every=10, keep_checkpoints=2, eval_records=8,
                 eval_acceptance_prompts=0, draft_vocab_size=100)
    train(cfg, target)
    out = Path(cfg.out_dir)
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-00000010", "step-00000020"]
    assert (out / "checkpoints" / "latest").read_text() == "step-00000020"
    head = load_head(out / "head", target.model)
    save_head(head, tmp_path / "again")
    again = load_head(tmp_path / "again", target.model)
    for (name, a), (_, b) in zip(head.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    # the draft vocabulary is the 100 most frequent assistant tokens of the training split (EOS included)
    store = FeatureStore(root / "feat")
    train_idx, _ = split_indices(len(store), cfg.eval_records, cfg.seed)
    from collections import Counter

    counts = Counter(t for i in train_idx for t, m in zip(*store.tokens(i)) if m)
    assert head.to_target_ids(torch.arange(100)).tolist() == select_draft_vocab(counts, 100, 320, [2]).tolist()
    with pytest.raises(ValueError, match="--resume"):
        train(cfg, target)
    with pytest.raises(ValueError, match="batch_size"):
        train(config(root, "roundtrip", max_steps=30, batch_size=4, eval_records=8, draft_vocab_size=100), target,
              resume=True)


def test_init_head_starts_from_the_given_head_and_refuses_another_shape(tiny):
    target, root = tiny
    train(config(root, "init-src", max_steps=60, draft_vocab_size=100, eval_acceptance_prompts=0), target)
    src = load_head(root / "init-src" / "head", target.model)
    # lr ~ 0: the fine-tuned head equals its start, draft vocabulary included (not re-selected from the data)
    tuned = train(config(root, "init-dst", max_steps=1, lr=1e-12, warmup_steps=0, draft_vocab_size=100,
                         eval_acceptance_prompts=0, init_head=str(root / "init-src" / "head")), target)
    dst = load_head(root / "init-dst" / "head", target.model)
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name
    fresh = train(config(root, "init-none", max_steps=1, lr=1e-12, warmup_steps=0, draft_vocab_size=100,
                         eval_acceptance_prompts=0), target)
    assert tuned["eval_acc"][0] > fresh["eval_acc"][0] + 0.2, (tuned, fresh)
    with pytest.raises(ValueError, match=r"draft_vocab_size 100 \(head\) vs 160 \(run\)"):
        train(config(root, "init-bad", max_steps=1, draft_vocab_size=160, eval_acceptance_prompts=0,
                     init_head=str(root / "init-src" / "head")), target)
    # init_vocab "data": a new draft vocabulary from the data; shared tokens keep their lm_head rows, the
    # rest of the head is copied, new tokens get rows mapped from the target's lm_head
    train(config(root, "init-vocab", max_steps=1, lr=1e-12, warmup_steps=0, draft_vocab_size=160,
                 eval_acceptance_prompts=0, init_head=str(root / "init-src" / "head"), init_vocab="data"), target)
    new = load_head(root / "init-vocab" / "head", target.model)
    assert new.config.draft_vocab_size == 160 and int(new.t2d.sum()) == 160
    src_ids = src.to_target_ids(torch.arange(100)).tolist()
    new_ids = new.to_target_ids(torch.arange(160)).tolist()
    shared = [t for t in new_ids if t in src_ids]
    assert len(shared) >= 80, len(shared)  # the source vocabulary came from the same data
    for t in shared:
        assert torch.allclose(new.lm_head.weight[new_ids.index(t)], src.lm_head.weight[src_ids.index(t)], atol=1e-6)
    other = {k: v for k, v in src.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    for k, v in other.items():
        assert torch.allclose(new.state_dict()[k], v, atol=1e-6), k
    fresh_rows = [i for i, t in enumerate(new_ids) if t not in src_ids]
    assert fresh_rows and new.lm_head.weight[fresh_rows].abs().sum() > 0
    with pytest.raises(ValueError, match="init_vocab must be head or data"):
        train(config(root, "init-bad2", max_steps=1, init_vocab="both", eval_acceptance_prompts=0,
                     init_head=str(root / "init-src" / "head")), target)
    with pytest.raises(ValueError, match="init_vocab data .* needs init_head"):  # not silently ignored
        train(config(root, "init-bad3", max_steps=1, init_vocab="data", eval_acceptance_prompts=0), target)


# ------------------------------------------------------------------------------------ resume after kill
def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "eaglespec.cli", *args]


def test_resume_after_sigkill_matches_an_uninterrupted_run(tiny):
    target, root = tiny
    out = root / "killed"
    flags = ["--model", str(root / "model"), "--data", str(root / "data"), "--out-dir", str(out),
             "--max-steps", "150", "--checkpoint-every", "20", "--eval-every", "0", "--eval-records", "8",
             "--eval-acceptance-prompts", "0", "--draft-vocab-size", "none", "--batch-size", "8", "--lr", "3e-3",
             "--warmup-steps", "5", "--threads", "1", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cli("train", *flags), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + 60
    while not latest.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (out / "head").exists()  # it really died before the end
    step = int((out / "checkpoints" / latest.read_text()).name.split("-")[1])
    assert step % 20 == 0 and 20 <= step < 150

    resumed = subprocess.run(cli("train", *flags, "--resume"), env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"(step {step})" in resumed.stderr and json.loads(resumed.stdout.splitlines()[-1])["step"] == 150

    cfg = TrainConfig(model=str(root / "model"), data=str(root / "data"), out_dir=str(root / "straight"),
                      max_steps=150, checkpoint_every=20, eval_every=0, eval_records=8, eval_acceptance_prompts=0,
                      draft_vocab_size=None, batch_size=8, lr=3e-3, warmup_steps=5, threads=1, progress=False)
    train(cfg)
    a, b = load_head(out / "head", target.model), load_head(root / "straight" / "head", target.model)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name  # same data order, optimizer, schedule and RNG: bit-identical


# ------------------------------------------------------------------------------------------ data parallel
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dp_worker(rank: int, world: int, port: int, cfg: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    train(TrainConfig(**cfg))


def test_two_process_data_parallel_step_equals_single_process_step(tiny):
    import torch.multiprocessing as mp

    target, root = tiny
    common = dict(model=str(root / "model"), features=str(root / "feat"), max_steps=2, eval_every=0,
                  eval_records=0, eval_acceptance_prompts=0, draft_vocab_size=120, lr=1e-3, warmup_steps=0,
                  threads=1, progress=False, grad_clip=0.05)
    single = TrainConfig(**common, out_dir=str(root / "dp1"), batch_size=4)
    train(single)
    dp = dict(common, out_dir=str(root / "dp2"), batch_size=2)
    mp.spawn(_dp_worker, args=(2, _free_port(), dp), nprocs=2, join=True)
    a, b = load_head(root / "dp1" / "head", target.model), load_head(root / "dp2" / "head", target.model)
    torch.manual_seed(0)  # the training runs' initialization
    init = DraftHead.for_target(target.model, "eagle3", draft_vocab_size=120)
    moved = 0
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=name)
        moved += int(name in dict(init.named_parameters()) and not torch.equal(x, init.state_dict()[name]))
    assert moved > 0


# ------------------------------------------------------------------------------------------- config
def test_config_from_yaml_and_flags(tmp_path):
    from eaglespec.cli import build_parser

    (tmp_path / "c.yaml").write_text("kind: eagle1\nlr: 2.0e-4\nbetas: [0.9, 0.99]\nfeatures: feat\n")
    cfg = TrainConfig.from_yaml(tmp_path / "c.yaml", lr=5e-4)
    assert cfg.kind == "eagle1" and cfg.lr == 5e-4 and cfg.betas == (0.9, 0.99) and cfg.noise == 0.1
    (tmp_path / "bad.yaml").write_text("learning_rate: 1\n")
    with pytest.raises(ValueError, match="unknown training config keys.*learning_rate"):
        TrainConfig.from_yaml(tmp_path / "bad.yaml")
    args = build_parser().parse_args(["train", "--config", str(tmp_path / "c.yaml"), "--draft-vocab-size", "none",
                                      "--feature-layer-ids", "1,2,3", "--betas", "0.8,0.9", "--no-progress"])
    assert args.config and args.draft_vocab_size is None and args.feature_layer_ids == (1, 2, 3)
    assert args.betas == (0.8, 0.9) and args.progress is False and not hasattr(args, "lr")
    with pytest.raises(ValueError, match="exactly one of"):
        TrainConfig(features="a", data="b").validate()


def test_token_loss_against_hand_computed_values():
    import math

    from eaglespec.train.train import token_loss

    logits = torch.tensor([[2.0, 0.0, -1.0]])
    probs = torch.tensor([[0.25, 0.7, 0.05]])  # the target's argmax (1) is not the draft's (0)
    z = math.log(math.exp(2.0) + math.exp(0.0) + math.exp(-1.0))
    logq = [2.0 - z, 0.0 - z, -1.0 - z]
    soft = -(0.25 * logq[0] + 0.7 * logq[1] + 0.05 * logq[2])
    hard = -logq[1]
    assert token_loss(logits, probs, "soft").item() == pytest.approx(soft, rel=1e-6)
    assert token_loss(logits, probs, "hard").item() == pytest.approx(hard, rel=1e-6)
    assert token_loss(logits, probs, "mixed", 0.25).item() == pytest.approx(0.75 * soft + 0.25 * hard, rel=1e-6)
    with pytest.raises(ValueError, match="labels must be soft, hard or mixed"):
        TrainConfig(features="x", labels="kl").validate()


def test_a_kill_during_a_checkpoint_write_resumes_bit_identically(tiny):
    """What kill -9 can leave mid-checkpoint: a half-written temporary step directory (truncated state.pt),
    a finished step directory the `latest` pointer does not name yet, a stray pointer temp file. Resuming
    uses the newest checkpoint the pointer names and ends bit-identical to the uninterrupted run."""
    import shutil

    target, root = tiny
    common = dict(model=str(root / "model"), data=str(root / "data"), max_steps=70, checkpoint_every=20,
                  eval_every=0, eval_records=8, eval_acceptance_prompts=0, draft_vocab_size=None, batch_size=8,
                  lr=3e-3, warmup_steps=5, threads=1, progress=False, keep_checkpoints=3)
    straight = root / "ckpt-straight"
    train(TrainConfig(out_dir=str(straight), **common), target)
    out = root / "ckpt-killed"
    shutil.copytree(straight, out)
    ckpts = out / "checkpoints"
    shutil.rmtree(out / "head")  # the run "died" before its end
    steps = sorted(p.name for p in ckpts.glob("step-*"))
    assert len(steps) >= 3, steps
    newest = steps[-1]
    half = ckpts / f".{newest}.tmp-4242"  # killed while writing the newest checkpoint ...
    shutil.copytree(ckpts / newest, half)
    state = half / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 3])  # ... in the middle of state.pt
    shutil.rmtree(ckpts / newest)
    (ckpts / "latest").write_text(steps[-3])  # and, earlier, between renaming a step and moving the pointer
    (ckpts / ".latest.tmp-4242").write_text("step-000")
    train(TrainConfig(out_dir=str(out), **common), target, resume=True)
    a, b = load_head(out / "head", target.model), load_head(straight / "head", target.model)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_learning_curve_reads_eval_points_in_token_order_and_plots(tiny, tmp_path):
    from eaglespec.train.curves import learning_curve, plot_learning_curves

    target, root = tiny
    cfg = config(root, "curve", max_steps=20, eval_every=10, eval_records=8, eval_acceptance_prompts=2,
                 eval_max_new_tokens=8, log_every=5)
    summary = train(cfg, target)
    pts = learning_curve(cfg.out_dir)
    assert [p.step for p in pts] == [10, 20]
    assert 0 < pts[0].tokens < pts[1].tokens == summary["tokens_seen"]
    assert all(p.tau is not None and p.tau >= 1.0 for p in pts)
    png = plot_learning_curves({"a": cfg.out_dir}, tmp_path / "c.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "bad.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not JSON"):
        learning_curve(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text('{"step": 1, "loss": [1.0]}\n')
    with pytest.raises(ValueError, match="no evaluation lines"):
        learning_curve(tmp_path / "empty.jsonl")


def test_step_plan_fits_the_step_count_to_the_time_left():
    from eaglespec.train.train import StepPlan

    assert StepPlan(cap=500).steps(10, 10, 99.0) == 500  # no budget: the cap
    plan = StepPlan(cap=10_000, budget=100.0, spent_before=20.0, reserve=5.0)
    assert plan.steps(3, 3, 1.0) == 10_000  # too few steps measured yet: the cap stands
    assert plan.steps(10, 10, 10.0) == 10 + 65  # 1 s a step, 100 - 20 - 10 - 5 s left
    assert StepPlan(cap=50, budget=100.0).steps(10, 10, 10.0) == 50  # never past the cap ...
    assert StepPlan(cap=50, budget=100.0).steps(50, 50, 10.0) == 50  # ... also with time left at the cap
    assert plan.steps(10, 10, 79.0) == 11  # less than the reserve left: at least the step under way
    assert plan.steps(10, 10, 80.0) == 10  # spent: stop here


def test_eval_count_spreads_evaluations_over_a_changing_step_count():
    from eaglespec.train.train import eval_due

    cfg = TrainConfig(data="d", eval_count=4, eval_every=3)
    assert [s for s in range(1, 101) if eval_due(s, 100, cfg)] == [25, 50, 75]  # the 4th is the final one
    assert [s for s in range(1, 13) if eval_due(s, 12, TrainConfig(data="d", eval_every=3))] == [3, 6, 9]
    with pytest.raises(ValueError, match="eval_count must be >= 1"):
        TrainConfig(data="d", eval_count=0).validate()
    with pytest.raises(ValueError, match="time_budget must be > 0"):
        TrainConfig(data="d", time_budget=0).validate()


def test_a_time_budget_ends_the_run_and_resume_counts_the_time_spent(tiny, tmp_path, monkeypatch):
    import itertools
    from types import SimpleNamespace

    import eaglespec.train.train as train_module

    target, root = tiny
    ticks = itertools.count()  # a clock that moves 10 ms at every reading: the run does not depend on this machine
    monkeypatch.setattr(train_module, "time", SimpleNamespace(perf_counter=lambda: 0.01 * next(ticks)))
    cfg = config(root, "budget", max_steps=100_000, time_budget=3.0, eval_count=2, eval_records=8,
                 eval_acceptance_prompts=0, checkpoint_every=5, log_every=1, draft_vocab_size=100)
    summary = train(cfg, target)
    assert cfg.max_steps == 100_000  # the caller's config is left as given
    assert 5 <= summary["step"] == summary["max_steps"] < 100_000
    assert 3.0 <= summary["run_seconds"] < 3.0 + 2.0  # stops at the budget: the last step and the final eval
    lines = [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in lines if "eval_acc" in x]
    assert len(evals) == 2 and evals[-1]["step"] == summary["step"]
    assert lines[-2]["step"] == summary["step"] and lines[-2]["max_steps"] == summary["step"]
    # a resumed run starts from its last checkpoint with the time spent up to it: only the rest of the budget
    again = train(config(root, "budget", max_steps=100_000, time_budget=3.0, eval_count=2, eval_records=8,
                         eval_acceptance_prompts=0, checkpoint_every=5, log_every=1, draft_vocab_size=100),
                  target, resume=True)
    assert again["run_seconds"] >= 3.0 and again["train_seconds"] < 1.5


def test_the_final_head_is_saved_before_the_final_evaluation(tiny, monkeypatch):
    import eaglespec.train.train as train_module

    target, root = tiny

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # a time limit's SIGINT during the last evaluation

    monkeypatch.setattr(train_module, "evaluate", interrupted)
    cfg = config(root, "cut", max_steps=3, eval_records=8, eval_acceptance_prompts=0, draft_vocab_size=100)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, target)
    assert load_head(Path(cfg.out_dir) / "head", target.model).config.draft_vocab_size == 100


def test_acceptance_eval_decodes_the_given_question_file(tiny, tmp_path, monkeypatch):
    import eaglespec.train.train as train_module

    target, root = tiny
    questions = [{"question_id": i, "category": "ab"[i % 2], "turns": [f"Say {w} {w}", "again"]}
                 for i, w in enumerate(WORDS[:6])]
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in questions))
    seen = []

    def fake_eval(target, head, prompts, depth, max_new_tokens):
        seen.append([list(p) for p in prompts])
        return {"tau": 1.0}

    monkeypatch.setattr(train_module, "acceptance_eval", fake_eval)
    train(config(root, "qeval", max_steps=2, draft_vocab_size=100, eval_records=8, eval_acceptance_prompts=3,
                 eval_prompts=f"mt={qfile}", eval_prompts_per_category=2), target)
    # the first 2 of each category (ids 0, 1, 2, 3 in file order), then the first 3; first turns only
    want = [encode_conversation(target.tokenizer, [f"Say {w} {w}"], []) for w in WORDS[:3]]
    assert seen and all(s == want for s in seen)
    with pytest.raises(ValueError, match="eval_prompts_per_category needs eval_prompts"):
        config(root, "x", eval_prompts_per_category=2).validate()
    for off in ({"eval_acceptance_prompts": 0}, {"eval_records": 0}):  # it would be silently ignored
        with pytest.raises(ValueError, match="eval_prompts needs eval_acceptance_prompts >= 1 and eval_records"):
            config(root, "x", eval_prompts=str(qfile), **off).validate()
    with pytest.raises(ValueError, match="eval_prompts: no such file .*missing.jsonl"):
        config(root, "x", eval_prompts=f"mt={tmp_path / 'missing.jsonl'}").validate()
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DatasetError, match="no questions"):
        train(config(root, "qeval2", max_steps=1, eval_prompts=str(tmp_path / "empty.jsonl")), target)


def test_fewer_held_out_records_than_a_batch_are_all_evaluated(tiny):
    """3 held-out records under a training batch of 8 (a small --eval-ids file, say) are evaluated, all of them:
    as many positions as the same 3 records read in batches of 2 (the split does not depend on the batch)."""
    target, root = tiny
    runs = [train(config(root, f"few-eval-{b}", max_steps=1, batch_size=b, eval_records=3,
                         eval_acceptance_prompts=0, draft_vocab_size=100), target) for b in (8, 2)]
    assert runs[0]["eval_positions"] == runs[1]["eval_positions"] > 0


def test_eval_ids_hold_out_the_same_records_on_grown_data(tiny, tmp_path):
    from eaglespec.train.train import split_by_ids

    target, root = tiny
    first = config(root, "ids1", features=None, data=str(root / "data"), max_steps=1, eval_records=8,
                   eval_acceptance_prompts=0, draft_vocab_size=100)
    train(first, target)
    held = (Path(first.out_dir) / "eval_ids.txt").read_text().split()
    records, _ = read_prepared(root / "data")
    assert len(held) == 8 and set(held) <= {r.id for r in records}
    # grown data: the same records in another order plus new ones; a seeded choice would hold out others
    lines = (root / "data" / "data.jsonl").read_text().splitlines()
    new = [json.dumps({**json.loads(line), "id": json.loads(line)["id"] + "-new"}) for line in lines[:40]]
    grown = tmp_path / "grown"
    grown.mkdir()
    (grown / "data.jsonl").write_text("\n".join(new + lines[::-1]) + "\n")
    (grown / "manifest.json").write_text((root / "data" / "manifest.json").read_text())
    second = config(root, "ids2", features=None, data=str(grown), max_steps=1, eval_records=8,
                    eval_acceptance_prompts=0, draft_vocab_size=100, eval_ids=str(Path(first.out_dir) / "eval_ids.txt"))
    train(second, target)
    assert sorted((Path(second.out_dir) / "eval_ids.txt").read_text().split()) == sorted(held)

    ids = ["a", "b", "c", "d"]
    assert split_by_ids(ids, ["d", "b"], 2) == ([0, 2], [1, 3])
    with pytest.raises(ValueError, match="eval_ids names 2 records but eval_records is 3"):
        split_by_ids(ids, ["d", "b"], 3)
    with pytest.raises(ValueError, match="1 of 2 ids are not in the data, e.g. \\['x'\\]"):
        split_by_ids(ids, ["x", "b"], 2)
    (tmp_path / "dup.txt").write_text("a\nb\na\n")
    with pytest.raises(ValueError, match="repeated record ids \\['a'\\]"):
        train(config(root, "ids3", features=None, data=str(grown), max_steps=1, eval_records=3,
                     eval_ids=str(tmp_path / "dup.txt")), target)
    with pytest.raises(ValueError, match="eval_ids needs `data`"):
        config(root, "x", eval_ids=str(tmp_path / "dup.txt")).validate()
    with pytest.raises(ValueError, match="eval_ids: no such file"):
        config(root, "x", features=None, data=str(grown), eval_ids=str(tmp_path / "none.txt")).validate()
