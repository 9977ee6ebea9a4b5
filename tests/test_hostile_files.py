"""Hostile and damaged files are refused with an error naming the file and the problem, before any long work:
safetensors heads (truncated, oversized header, mis-shaped, NaN weights), head configs (missing keys, negative
sizes, a vocabulary that is not the target's, feature layers out of range), GGUF files (truncated, NaN tensor
data), truncated training checkpoints (state.pt), corrupt prepared-data lines and feature shards.
"""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglespec.train.data import read_prepared
from eaglespec.spec.heads import DraftHead, HeadLoadError, load_head, save_head
from helpers import tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=0)[0]


@pytest.fixture(scope="module")
def good_head(target, tmp_path_factory):
    torch.manual_seed(0)
    return save_head(DraftHead.for_target(target.model, "eagle3", draft_vocab_size=64), tmp_path_factory.mktemp("h"))


def copy_head(good_head, tmp_path):
    d = tmp_path / "head"
    shutil.copytree(good_head, d)
    return d, d / "model.safetensors", d / "config.json"


# --------------------------------------------------------------------------------------------- heads

def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[: keep(len(data))])


def _oversized_header(path):
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 1 << 60) + data[8:])  # header length far past the file


def _header_past_file(path):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    path.write_bytes(data[: 8 + n])  # header intact, no tensor bytes


def _edit_tensors(edit):
    def apply(path):
        sd = load_file(str(path))
        edit(sd)
        save_file(sd, str(path), metadata={"format": "pt"})
    return apply


def _nan(sd):
    w = sd["midlayer.self_attn.q_proj.weight"].clone()
    w[3, 5] = float("nan")
    sd["midlayer.self_attn.q_proj.weight"] = w


WEIGHT_DAMAGE = {
    "truncated in the tensor data": (lambda p: _truncate(p, lambda n: n - 100), "unreadable head files"),
    "truncated in the header": (lambda p: _truncate(p, lambda n: 20), "unreadable head files"),
    "empty file": (lambda p: _truncate(p, lambda n: 0), "unreadable head files"),
    "oversized header length": (_oversized_header, "unreadable head files"),
    "header but no data": (_header_past_file, "unreadable head files"),
    "mis-shaped tensor": (_edit_tensors(lambda sd: sd.update({"fc.weight": torch.zeros(64, 100)})), "fc.weight"),
    "NaN weight": (_edit_tensors(_nan), "non-finite"),
    "inf weight": (_edit_tensors(lambda sd: sd["midlayer.mlp.up_proj.weight"].__setitem__((0, 0), float("inf"))),
                   "non-finite"),
    "integer weight": (_edit_tensors(lambda sd: sd.update({"fc.weight": sd["fc.weight"].to(torch.int32)})),
                       "non-float"),
}


@pytest.mark.parametrize("damage", sorted(WEIGHT_DAMAGE))
def test_damaged_head_weights_are_refused_naming_the_file(target, good_head, tmp_path, damage):
    d, weights, _ = copy_head(good_head, tmp_path)
    edit, words = WEIGHT_DAMAGE[damage]
    edit(weights)
    with pytest.raises(HeadLoadError) as e:
        load_head(d, target.model)
    assert str(d) in str(e.value) and words in str(e.value), str(e.value)


def _cfg(edit):
    def apply(path):
        cfg = json.loads(path.read_text())
        edit(cfg)
        path.write_text(json.dumps(cfg))
    return apply


CONFIG_DAMAGE = {
    "not JSON": (lambda p: p.write_text('{"architectures": ['), "unreadable head files"),
    "missing hidden_size": (_cfg(lambda c: c.pop("hidden_size")), "hidden_size"),
    "negative hidden_size": (_cfg(lambda c: c.update(hidden_size=-64)), "hidden_size"),
    "zero heads": (_cfg(lambda c: c.update(num_attention_heads=0)), "num_attention_heads"),
    "huge intermediate_size": (_cfg(lambda c: c.update(intermediate_size=10**12)), "intermediate_size"),
    "too many layers": (_cfg(lambda c: c.update(num_hidden_layers=10**6)), "num_hidden_layers"),
    "vocab of another target": (_cfg(lambda c: c.update(vocab_size=c["vocab_size"] + 1)), "vocab"),
    "feature layer out of range": (_cfg(lambda c: c["eaglespec"].update(feature_layer_ids=[0, 1, 99])),
                                   "feature_layer_ids"),
    "negative feature layer": (_cfg(lambda c: c["eaglespec"].update(feature_layer_ids=[-1, 1, 2])),
                               "feature_layer_ids"),
    "draft vocab larger than the vocabulary": (_cfg(lambda c: c.update(draft_vocab_size=10**6)), "draft_vocab_size"),
}


@pytest.mark.parametrize("damage", sorted(CONFIG_DAMAGE))
def test_absurd_head_configs_are_refused_naming_the_file(target, good_head, tmp_path, damage):
    d, _, config = copy_head(good_head, tmp_path)
    cfg = json.loads(config.read_text())
    assert "eaglespec" in cfg and "feature_layer_ids" in cfg["eaglespec"], cfg  # the layout the edits assume
    edit, words = CONFIG_DAMAGE[damage]
    edit(config)
    with pytest.raises(HeadLoadError) as e:
        load_head(d, target.model)
    assert str(d) in str(e.value) and words in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------------- GGUF

def _write_gguf(path, tensors):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_truncated_gguf_is_refused_naming_the_file(tmp_path):
    pytest.importorskip("gguf")
    from eaglespec.runtime.gguf_blocks import check_gguf
    from eaglespec.runtime.gguf_blocks import read_quant_tensors

    arr = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    path = tmp_path / "m.gguf"
    _write_gguf(path, {"blk.0.attn_q.weight": arr, "blk.0.attn_k.weight": arr})
    check_gguf(path)  # intact: fine
    full = path.read_bytes()
    for keep in (len(full) - 1000, len(full) // 2, 40, 3):
        path.write_bytes(full[:keep])
        with pytest.raises(ValueError) as e:
            check_gguf(path)
        assert str(path) in str(e.value) and ("truncated" in str(e.value) or "unreadable" in str(e.value)), e.value
        with pytest.raises(ValueError, match="m.gguf"):
            read_quant_tensors(path)


def test_gguf_with_nan_tensor_data_is_refused_naming_the_tensor(tmp_path):
    pytest.importorskip("gguf")
    from eaglespec.runtime.gguf_blocks import check_gguf

    arr = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    bad = arr.copy()
    bad[7, 9] = np.nan
    path = tmp_path / "m.gguf"
    _write_gguf(path, {"blk.0.attn_q.weight": arr, "blk.0.attn_v.weight": bad})
    with pytest.raises(ValueError, match=r"m\.gguf.*blk\.0\.attn_v\.weight.*non-finite"):
        check_gguf(path)


# ---------------------------------------------------------------------------------- training inputs


def _prepared(tmp_path, lines):
    d = tmp_path / "data"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"data_file": "data.jsonl"}))
    (d / "data.jsonl").write_text("".join(lines))
    return d


GOOD = json.dumps({"id": "a", "input_ids": [1, 5, 6, 2], "loss_mask": [0, 0, 1, 1]}) + "\n"
BAD_LINES = {
    "cut mid-line": GOOD[:30] + "\n",
    "missing loss_mask": json.dumps({"id": "b", "input_ids": [1, 2]}) + "\n",
    "lengths differ": json.dumps({"id": "b", "input_ids": [1, 2, 3], "loss_mask": [0, 1]}) + "\n",
    "negative token": json.dumps({"id": "b", "input_ids": [1, -2], "loss_mask": [0, 1]}) + "\n",
    "string tokens": json.dumps({"id": "b", "input_ids": ["1", "2"], "loss_mask": [0, 1]}) + "\n",
    "mask not 0/1": json.dumps({"id": "b", "input_ids": [1, 2], "loss_mask": [0, 7]}) + "\n",
    "not an object": "[1, 2, 3]\n",
}


@pytest.mark.parametrize("damage", sorted(BAD_LINES))
def test_corrupt_prepared_data_line_is_refused_naming_file_and_line(tmp_path, damage):
    d = _prepared(tmp_path, [GOOD, GOOD, BAD_LINES[damage], GOOD])
    with pytest.raises(ValueError, match=r"data\.jsonl:3: corrupt record"):
        read_prepared(d)
    assert len(read_prepared(_prepared(tmp_path / "ok", [GOOD, GOOD]))[0]) == 2


@pytest.fixture(scope="module")
def features(target, tmp_path_factory):
    from eaglespec.train.data import PreparedRecord
    from eaglespec.train.features import capture_features
    from eaglespec.spec.heads import default_feature_layer_ids

    root = tmp_path_factory.mktemp("feat")
    d = root / "data"
    d.mkdir()
    recs = [PreparedRecord(str(i), [1] + [5 + i + j for j in range(10)] + [2], [0] * 6 + [1] * 6) for i in range(6)]
    (d / "manifest.json").write_text(json.dumps({"data_file": "data.jsonl"}))
    (d / "data.jsonl").write_text("".join(json.dumps({"id": r.id, "input_ids": r.input_ids,
                                                      "loss_mask": r.loss_mask}) + "\n" for r in recs))
    capture_features(target, d, root / "feat", default_feature_layer_ids(target.model.args.num_hidden_layers),
                     torch.float32, shard_records=3, batch_tokens=256, progress=False)
    return root / "feat"


def test_damaged_feature_shard_is_refused_naming_it(features, tmp_path):
    from eaglespec.train.features import FeatureStore

    assert len(FeatureStore(features)) == 6
    manifest = json.loads((features / "manifest.json").read_text())
    shard = manifest["shards"][1]["file"]
    for damage in ("truncated", "offsets"):
        d = tmp_path / damage
        shutil.copytree(features, d)
        if damage == "truncated":
            data = (d / shard).read_bytes()
            (d / shard).write_bytes(data[: len(data) // 2])
        else:
            sd = load_file(str(d / shard))
            sd["offsets"] = sd["offsets"] * 2  # records past the end of the tensors
            save_file(sd, str(d / shard))
        with pytest.raises(ValueError) as e:
            FeatureStore(d)
        assert str(d / shard) in str(e.value), e.value


def test_truncated_training_checkpoint_is_refused_naming_it(tmp_path):
    """The resume path reads state.pt through _read_state before building the data (capture can take hours)."""
    from eaglespec.train.train import _read_state

    path = tmp_path / "state.pt"
    torch.save({"config": {}, "world_size": 1, "step": 20, "optimizer": {"state": {}},
                "rng": torch.get_rng_state()}, path)
    assert _read_state(path)["step"] == 20
    full = path.read_bytes()
    for keep in (len(full) - 7, len(full) // 2, 10, 0):
        path.write_bytes(full[:keep])
        with pytest.raises(ValueError, match=r"state\.pt: unreadable training checkpoint"):
            _read_state(path)
    torch.save({"step": 3}, path)
    with pytest.raises(ValueError, match=r"state\.pt: not an eaglespec training checkpoint"):
        _read_state(path)
