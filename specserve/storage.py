"""Where specserve keeps its files, and files only their owner may use.

At the bottom of the package (it imports nothing of specserve): the kernels' build cache, the
model loader, the fleet's secrets and `--api-key-file` all use it. A private directory is 0700
and this user's; a private file is a regular file this user owns that nobody else may read or
write. A file that fails those checks may have been planted or changed by someone else, and is
refused with the reason and the fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def default_cache_dir() -> Path:
    """`$SPECSERVE_CACHE` if set, else `~/.cache/specserve`."""
    env = os.environ.get("SPECSERVE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specserve"


def private_dir(path: Path) -> Path:
    """`path` as a directory only this user may use (created 0700, tightened to 0700 if looser);
    OSError if it is not a directory this user owns."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise OSError(f"cache directory {path} is not a directory owned by this user")
    if st.st_mode & 0o077:
        path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> Path:
    """`text` in `path`, readable and writable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path


# The most a private file may hold: keys, an address, a token. A larger one is refused, never
# cut short (a key cut at the boundary would be a valid shorter key).
MAX_PRIVATE_BYTES = 1 << 20


def read_private(path: str | Path, what: str, limit: int = MAX_PRIVATE_BYTES) -> str:
    """The whole text of private file `path`. ValueError naming `what`, the file and the fix
    when it is not a regular file, another user owns it, group or others may access it, or it
    holds more than `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror}") from exc
    try:
        _check_private(f"{what} {path}", os.fstat(fd))  # the file opened, not what path names
        data = _read_all(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{what} {path}: larger than {limit} bytes; refused rather than cut")
    return data.decode("utf-8")


def _read_all(fd: int, most: int) -> bytes:
    """Up to `most` bytes of `fd`, to its end: os.read may return fewer than asked."""
    parts: list[bytes] = []
    got = 0
    while got < most:
        part = os.read(fd, min(most - got, 1 << 16))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _check_private(name: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{name}: not a regular file")
    if st.st_uid != os.getuid():
        raise ValueError(f"{name}: owned by uid {st.st_uid}, not by this user (uid {os.getuid()})")
    if st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        raise ValueError(f"{name}: group or others may access it (mode {mode:04o}); chmod 600 it")
