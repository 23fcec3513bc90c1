"""Compile a kernel's C file with the system compiler on first use, cache it, load it.

Each kernel module (`ggml.py`, `attention.py`) names its source, flags and the CPU features
those flags assume. The shared object lands in the specserve cache under a name keyed by the
source and flags; a machine that lacks the features or a working compiler gets None and one
log line saying why, and the caller runs its torch path instead.

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

AVX2_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-fPIC", "-shared")
AVX2_CPU = ("avx2", "fma", "f16c")


@dataclass(frozen=True)
class KernelSource:
    source: Path
    cflags: tuple[str, ...]
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags the compiled code needs
    label: str  # for log lines: "GGUF block kernels"


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _compile(spec: KernelSource, target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / target.name
        subprocess.run(
            [compiler, *spec.cflags, str(spec.source), "-o", str(staged), "-lm"],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(staged, target)  # appears complete or not at all


def load(spec: KernelSource, logger: logging.Logger) -> ctypes.CDLL | None:
    """The compiled library, or None (logged once by the caller's cache) when it cannot run."""
    missing = [f for f in spec.cpu_flags if f not in cpu_flags()]
    if missing:
        logger.info("%s off: CPU lacks %s", spec.label, ", ".join(missing))
        return None
    from specserve.models.loader import default_cache_dir

    key = hashlib.sha256(spec.source.read_bytes() + " ".join(spec.cflags).encode()).hexdigest()
    target = default_cache_dir() / "kernels" / f"{spec.source.stem}-{key[:16]}.so"
    try:
        if not target.is_file():
            _compile(spec, target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        logger.warning("%s off: cannot build %s: %s", spec.label, spec.source.name, detail)
        return None
