"""File digests remembered across restarts, atomic JSON writes, and the checks that let a cache
trust only what it wrote itself.

Hashing a 500 MB checkpoint takes seconds, so a digest is kept in `<cache>/file-hashes.json`
keyed by (resolved path, size, mtime) and recomputed only when one of those changes. Cache
directories are made 0700 (`private_dir`): a file in one, owned by this user and writable by
nobody else (`untrusted_reason`), was written by this user.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from specserve.storage import private_dir

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
        private_dir(cache_dir)
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


def untrusted_reason(path: Path) -> str | None:
    """Why a cached file must not be used as is (None: it may be): not a regular file (a
    symlink included), owned by another user, or writable by group or others."""
    try:
        st = path.lstat()
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not this user"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


SEAL_FILE = "specserve-complete.json"


def seal(directory: Path, cache_dir: Path | None = None) -> None:
    """Record every file of (flat) `directory` with its sha256: it is complete as written.
    With `cache_dir`, digests come through its index (`cached_sha256`)."""
    names = sorted(p.name for p in directory.iterdir() if p.name != SEAL_FILE)
    files = {
        name: sha256_file(directory / name)
        if cache_dir is None
        else cached_sha256(directory / name, cache_dir)
        for name in names
    }
    write_json_atomically(directory / SEAL_FILE, {"files": files})


def unsealed_reason(directory: Path, cache_dir: Path) -> str | None:
    """Why `directory` is not as `seal` left it (None: it is): no seal, a file added, missing
    or changed (rehashed when its size or mtime moves), or one `untrusted_reason` refuses."""
    reason = untrusted_reason(directory / SEAL_FILE)
    if reason is not None:
        return f"{SEAL_FILE}: {reason}"
    files = read_json_object(directory / SEAL_FILE).get("files")
    if not isinstance(files, dict):
        return f"{SEAL_FILE} lists no files"
    present = {p.name for p in directory.iterdir()} - {SEAL_FILE}
    if present != set(files):
        return f"files not as sealed: {sorted(present ^ set(files))}"
    for name, digest in sorted(files.items()):
        path = directory / name
        reason = untrusted_reason(path)
        if reason is not None:
            return f"{name}: {reason}"
        if cached_sha256(path, cache_dir) != digest:
            return f"{name}: its bytes differ from the seal"
    return None
