"""Secrets handed to Ray Serve replicas by file, never by value.

Ray writes a deployment's `runtime_env` (environment variables included) and its `user_config`
to its logs, readable by every local user. So a secret goes into a file that only its owner can
read, in a directory only its owner can enter, and the deployment carries the file's path. The
file is named by a hash of the secret: deploying the same key again names the same file, so a
redeploy does not restart the ingress.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from specserve.models.loader import default_cache_dir


def secrets_dir() -> Path:
    """`<cache>/secrets`, mode 0700 (made so if it was not)."""
    path = default_cache_dir() / "secrets"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_secret(name: str, value: str) -> Path:
    """`value` in a 0600 file named after `name` and the value's hash; its path."""
    digest = hashlib.sha256(value.encode()).hexdigest()[:16]
    return write_private(secrets_dir() / f"{name}-{digest}", value)


def write_private(path: Path, value: str) -> Path:
    """`value` in `path`, readable and writable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(value)
    os.chmod(path, 0o600)
    return path


def read_secret(path: str | Path) -> str:
    """The text in `path`; ValueError if another user owns it or others may read or write it
    (a file planted or changed by someone else is not trusted)."""
    info = os.stat(path)
    if info.st_uid != os.getuid():
        raise ValueError(f"{path}: owned by uid {info.st_uid}, not by this user")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path}: readable or writable by others (mode {info.st_mode & 0o777:o})")
    return Path(path).read_text(encoding="utf-8")
