"""Fingerprints of a model directory: what decides its outputs, hashed. config.json counts by
meaning (canonical JSON, so formatting does not), weights by the bytes of every file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specserve.hashing import cached_sha256
from specserve.models.registry import source_files
from specserve.storage import default_cache_dir

Fingerprint = dict[str, Any]


def target_fingerprint(model_dir: Path, cache_dir: Path | None = None) -> Fingerprint:
    """Hashes of the target's config.json and its own weights (Medusa heads excluded): the
    GGUF's bytes, or the checkpoint's safetensors files'."""
    files = source_files(model_dir)
    return {
        "config_sha256": config_sha256(model_dir / "config.json"),
        "weights_sha256": files_sha256(files, cache_dir),
    }


def config_sha256(path: Path) -> str:
    canonical = json.dumps(json.loads(path.read_text(encoding="utf-8")), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def files_sha256(files: list[Path], cache_dir: Path | None = None) -> str:
    """One digest over (name, sha256 of bytes) of each file, in name order."""
    h = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.name):
        h.update(f"{path.name}\0{cached_sha256(path, cache_dir or default_cache_dir())}\n".encode())
    return h.hexdigest()
