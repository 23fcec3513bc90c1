"""`--api-key-file`: API keys read from a file only its owner can read, so that they are on no
command line (`ps` shows those to every local user) and in no environment.

One line is the server's key. Several lines are several keys, one per tenant: any of them is
accepted, and each tenant's requests share cached prompt blocks and suffix-index drafts only
with requests made with the same key (`ServerSettings.tenant_keys`).

`--admin-key-file` holds the operator's key: with tenant keys, /info and the cache resets take
only it (a tenant key gets 403 there), since they show or empty every tenant's caches."""

from __future__ import annotations

from typing import Any

from specserve.storage import read_private


def read_key_file(path: str, flag: str = "--api-key-file") -> tuple[str, ...]:
    """The keys in `path`, one a line, surrounding whitespace stripped, blank lines skipped.
    ValueError, naming `flag`, the file and the fix, for a file that group or others may read
    or write, that another user owns, that is not a regular file, that holds no key or one key
    twice."""
    text = read_private(path, flag)
    keys = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not keys:
        raise ValueError(f"{flag} {path}: the file is empty")
    if len(set(keys)) != len(keys):
        raise ValueError(f"{flag} {path}: a key is listed twice")
    return keys


def admin_key(path: str | None) -> str | None:
    """`--admin-key-file`: the one key in `path` (same rules as --api-key-file), or None."""
    if path is None:
        return None
    keys = read_key_file(path, "--admin-key-file")
    if len(keys) != 1:
        raise ValueError(f"--admin-key-file {path}: holds {len(keys)} keys, not one")
    return keys[0]


def api_keys(given: str | None, key_file: str | None) -> dict[str, Any]:
    """`ServerSettings`' key fields from --api-key or --api-key-file: `api_key` for one key,
    `tenant_keys` for several. ValueError if both flags are set."""
    if key_file is None:
        return {"api_key": given}
    if given is not None:
        raise ValueError("give --api-key (API_KEY) or --api-key-file (API_KEY_FILE), not both")
    keys = read_key_file(key_file)
    return {"api_key": keys[0]} if len(keys) == 1 else {"tenant_keys": keys}
