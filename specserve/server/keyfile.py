"""`--api-key-file`: the API key read from a file only its owner can read, so that it is on no
command line (`ps` shows those to every local user) and in no environment."""

from __future__ import annotations

from specserve.storage import read_private


def read_key_file(path: str) -> str:
    """The key in `path`, surrounding whitespace stripped. ValueError, naming the file and the
    fix, for a file that group or others may read or write, that another user owns, that is
    not a regular file, is empty or holds more than one line."""
    key = read_private(path, "--api-key-file").strip()
    if not key:
        raise ValueError(f"--api-key-file {path}: the file is empty")
    if "\n" in key:
        raise ValueError(f"--api-key-file {path}: the key must be one line")
    return key


def api_key(given: str | None, key_file: str | None) -> str | None:
    """The key from --api-key or from --api-key-file; ValueError if both are set."""
    if key_file is None:
        return given
    if given is not None:
        raise ValueError("give --api-key (API_KEY) or --api-key-file (API_KEY_FILE), not both")
    return read_key_file(key_file)
