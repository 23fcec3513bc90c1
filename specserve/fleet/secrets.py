"""Secrets handed to Ray Serve replicas by file, never by value.

Ray writes a deployment's `runtime_env` (environment variables included) and its `user_config`
to its logs, readable by every local user. So a secret goes into a private file (see
`specserve/storage.py`) in `<cache>/secrets` (0700), and the deployment carries the file's
path. The file's name is random (a name derived from the secret, such as its hash, would be in
those logs too: an offline check for a weak key); deploying the same secret again finds the file
that holds it and names it again, so a redeploy does not restart the ingress. `fleet down`
removes them (`remove_secrets`).
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

from specserve.storage import default_cache_dir, private_dir, read_private, write_private


def secrets_dir() -> Path:
    return private_dir(default_cache_dir() / "secrets")


def write_secret(name: str, value: str) -> Path:
    """A private file named `name-<random>` holding `value` (the one already holding it, if
    any); its path."""
    folder = secrets_dir()
    for path in sorted(folder.glob(f"{name}-*")):
        try:
            held = read_private(path, "secret file")
        except ValueError:
            continue
        if hmac.compare_digest(held.encode(), value.encode()):
            return path
    return write_private(folder / f"{name}-{secrets.token_hex(16)}", value)


def read_secret(path: str | Path) -> str:
    """The secret in private file `path` (ValueError if it is not private: see read_private)."""
    return read_private(path, "secret file")


def remove_secrets() -> int:
    """Remove every secret file `write_secret` wrote (a fleet is gone); how many."""
    folder = default_cache_dir() / "secrets"
    removed = 0
    for path in folder.glob("*-*") if folder.is_dir() else ():
        path.unlink(missing_ok=True)
        removed += 1
    return removed
