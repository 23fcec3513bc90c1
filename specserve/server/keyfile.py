"""`--api-key-file`: the API key read from a file only its owner can read, so that it is on no
command line (`ps` shows those to every local user) and in no environment."""

from __future__ import annotations

import os
import stat


def read_key_file(path: str) -> str:
    """The key in `path`, surrounding whitespace stripped. ValueError, naming the file and the
    fix, for a file that group or others may read or write, that another user owns, that is
    not a regular file, is empty or holds more than one line."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ValueError(f"--api-key-file {path}: {exc.strerror}") from exc
    try:
        _check_private(path, os.fstat(fd))  # the file opened, not what the path names later
        key = os.read(fd, 1 << 16).decode("utf-8").strip()
    finally:
        os.close(fd)
    if not key:
        raise ValueError(f"--api-key-file {path}: the file is empty")
    if "\n" in key:
        raise ValueError(f"--api-key-file {path}: the key must be one line")
    return key


def _check_private(path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"--api-key-file {path}: not a regular file")
    if st.st_uid != os.getuid():
        raise ValueError(
            f"--api-key-file {path}: owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
        )
    if st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        raise ValueError(
            f"--api-key-file {path}: group or others may access it (mode {mode:04o}); "
            f"run: chmod 600 {path}"
        )


def api_key(given: str | None, key_file: str | None) -> str | None:
    """The key from --api-key or from --api-key-file; ValueError if both are set."""
    if key_file is None:
        return given
    if given is not None:
        raise ValueError("give --api-key (API_KEY) or --api-key-file (API_KEY_FILE), not both")
    return read_key_file(key_file)
