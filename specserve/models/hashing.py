"""File digests remembered across restarts, and atomic JSON writes.

Hashing a 500 MB checkpoint takes seconds, so a digest is kept in `<cache>/file-hashes.json`
keyed by (resolved path, size, mtime) and recomputed only when one of those changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

INDEX_FILE = "file-hashes.json"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def cached_sha256(path: Path, cache_dir: Path) -> str:
    """sha256 of a file's bytes, remembered per (path, size, mtime)."""
    stat = path.stat()
    key, stamp = str(path.resolve()), {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    index_path = cache_dir / INDEX_FILE
    index = read_json_object(index_path)
    entry = index.get(key)
    entry = entry if isinstance(entry, dict) else {}
    if all(entry.get(k) == v for k, v in stamp.items()) and isinstance(entry.get("sha256"), str):
        return str(entry["sha256"])
    digest = sha256_file(path)
    index = {k: v for k, v in index.items() if Path(k).is_file()}
    index[key] = {**stamp, "sha256": digest}
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomically(index_path, index)
    except OSError:
        logger.warning("could not update the hash index %s", index_path)
    return digest


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # missing or damaged: only costs a rehash
    return value if isinstance(value, dict) else {}


def write_json_atomically(path: Path, payload: Any) -> None:
    """Write JSON to a temp file beside `path`, then rename: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
