"""Compile a kernel's C file with the system compiler on first use, cache it, load it.

Each kernel module (`ggml.py`, `attention.py`) names its source, flags and the CPU features
those flags assume. The shared object lands in the specserve cache (`kernels/`, 0700) under a
name keyed by the source, the flags, the compiler and the CPU; the compile has a timeout.
Beside it goes the sha256 of what was built; a cached library is loaded only if it and that
record are regular files of this user that nobody else may write, and its bytes still hash to
the record. Anything else (a planted or damaged file) is rebuilt, never loaded. A machine that lacks
the features or a working compiler gets None and one log line saying why, and the caller runs
its torch path instead.

The libraries link `libgomp.so.1` by soname. torch is imported first, so the dynamic loader
hands them torch's own already-loaded copy: one OpenMP thread pool for all.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch  # noqa: F401  (loaded before any kernel: its libgomp is the one they share)

from specserve.hashing import (
    read_json_object,
    sha256_file,
    untrusted_reason,
    write_json_atomically,
)
from specserve.storage import default_cache_dir, private_dir

# -ffp-contract=off: an a * b + c stays two roundings, as torch's elementwise ops round it;
# the kernels write their FMAs explicitly where they want them.
AVX2_FLAGS = (
    "-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared",
)  # fmt: skip
AVX2_CPU = ("avx2", "fma", "f16c")
COMPILE_TIMEOUT_S = 120.0  # a compiler that hangs must not hang the server's start


@dataclass(frozen=True)
class KernelSource:
    source: Path
    cflags: tuple[str, ...]
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags the compiled code needs
    label: str  # for log lines: "GGUF block kernels"
    headers: tuple[Path, ...] = ()  # files the source includes (part of the cache key)


def _cpuinfo(field: str) -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(field):
            return line.split(":", 1)[1].strip()
    return ""


def cpu_flags() -> set[str]:
    return set(_cpuinfo("flags").split())


def _compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    return compiler


def _compiler_id(compiler: str) -> str:
    """The compiler's path and its own version line: a different compiler builds anew."""
    try:
        done = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"C compiler {compiler!r} does not run: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(f"C compiler {compiler!r} --version failed: {done.stderr.strip()}")
    version = (done.stdout.splitlines() or [""])[0]
    return f"{shutil.which(compiler) or compiler} {version}"


def cache_key(spec: KernelSource, compiler_id: str) -> str:
    """Source, flags, compiler and CPU (model and flags): a library is only ever loaded on the
    kind of machine, and from the compiler, that built it."""
    parts = [
        spec.source.read_bytes(),
        *(h.read_bytes() for h in spec.headers),
        " ".join(spec.cflags).encode(),
        compiler_id.encode(),
        _cpuinfo("model name").encode(),
        " ".join(sorted(cpu_flags())).encode(),
    ]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def record_path(target: Path) -> Path:
    """Where the sha256 of a built library is kept."""
    return target.with_name(target.name + ".sha256.json")


def untrusted_library(target: Path) -> str | None:
    """Why the cached library must not be loaded (None: it may): see the module docstring."""
    if not target.exists() and not target.is_symlink():
        return "not built yet"
    reason = untrusted_reason(target) or untrusted_reason(record_path(target))
    if reason is not None:
        return reason
    if read_json_object(record_path(target)).get("sha256") != sha256_file(target):
        return "its bytes differ from the build's record"
    return None


def _compile(spec: KernelSource, compiler: str, target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / target.name
        try:
            subprocess.run(
                [compiler, *spec.cflags, str(spec.source), "-o", str(staged), "-lm"],
                check=True,
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"compiling took over {COMPILE_TIMEOUT_S:.0f} s") from exc
        staged.chmod(0o700)
        write_json_atomically(record_path(target), {"sha256": sha256_file(staged)})
        if target.is_symlink() or target.is_dir():
            target.unlink()  # os.replace would write through neither
        os.replace(staged, target)  # appears complete or not at all


def load(spec: KernelSource, logger: logging.Logger) -> ctypes.CDLL | None:
    """The compiled library, or None (logged once by the caller's cache) when it cannot run."""
    missing = [f for f in spec.cpu_flags if f not in cpu_flags()]
    if missing:
        logger.info("%s off: CPU lacks %s", spec.label, ", ".join(missing))
        return None
    try:
        compiler = _compiler()
        target = private_dir(default_cache_dir() / "kernels")
        target /= f"{spec.source.stem}-{cache_key(spec, _compiler_id(compiler))}.so"
        why = untrusted_library(target)
        if why is not None:
            if why != "not built yet":
                logger.warning("%s: rebuilding %s: %s", spec.label, target, why)
            _compile(spec, compiler, target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        logger.warning("%s off: cannot build %s: %s", spec.label, spec.source.name, detail)
        return None
