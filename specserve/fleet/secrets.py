"""Secrets handed to Ray Serve replicas by file, never by value.

Ray writes a deployment's `runtime_env` (environment variables included) and its `user_config`
to its logs, readable by every local user. So a secret goes into a private file (see
`specserve/storage.py`) in `<cache>/secrets` (0700), and the deployment carries the file's
path. The file is named by a hash of the secret: deploying the same key again names the same
file, so a redeploy does not restart the ingress.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from specserve.storage import default_cache_dir, private_dir, read_private, write_private


def write_secret(name: str, value: str) -> Path:
    """`value` in a private file named after `name` and the value's hash; its path."""
    digest = hashlib.sha256(value.encode()).hexdigest()[:16]
    return write_private(private_dir(default_cache_dir() / "secrets") / f"{name}-{digest}", value)


def read_secret(path: str | Path) -> str:
    """The secret in private file `path` (ValueError if it is not private: see read_private)."""
    return read_private(path, "secret file")
