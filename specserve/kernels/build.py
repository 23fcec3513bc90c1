"""Compile a kernel library's C units with the system compiler on first use, cache it, load it.

Each kernel module (`ggml.py`, `attention.py`) names its library's units (`.c` files, compiled
each on its own, in parallel, then linked), flags and the CPU features those flags assume. The
shared object lands in the specserve cache (`kernels/`, 0700) under a name keyed by every file
the compiler reads to build it (the units, their headers and the system headers under those,
as its own dependency output `-M` lists them: no list kept by hand), the flags, the compiler
and the CPU; every compiler run has a timeout. What `-M` said is remembered beside the library
(`*.files.json`, keyed by the units' own bytes, flags and compiler), so that a process loading a
built library hashes those files instead of running the compiler: a library is found under the
key of those files' bytes only if they are as they were when `-M` listed them, and then the
compiler would read the same files; any miss runs `-M` again.
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
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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
# the kernels write their FMAs explicitly where they want them. -fvisibility=hidden: a library
# exports only what its headers mark KERNEL_API (export.h); what its units share stays inside.
AVX2_FLAGS = (
    "-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-fPIC",
    "-fvisibility=hidden",
)  # fmt: skip
AVX2_CPU = ("avx2", "fma", "f16c")
COMPILE_TIMEOUT_S = 120.0  # a compiler that hangs must not hang the server's start


@dataclass(frozen=True)
class KernelSource:
    """A shared library and the C units it is built from (their headers are found by the
    compiler, `files_read`)."""

    name: str  # the library's file stem: "ggml_blocks"
    sources: tuple[Path, ...]  # its .c units, all in one directory
    cflags: tuple[str, ...]
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags the compiled code needs
    label: str  # for log lines: "GGUF block kernels"

    @property
    def home(self) -> Path:
        return self.sources[0].parent


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


def _run(command: Sequence[str], cwd: Path, what: str, deadline: float | None = None) -> str:
    """The command's stdout; RuntimeError if it runs past COMPILE_TIMEOUT_S (or the monotonic
    `deadline`), CalledProcessError (its stderr kept) if it fails."""
    timeout = COMPILE_TIMEOUT_S if deadline is None else max(deadline - time.monotonic(), 0.0)
    try:
        done = subprocess.run(
            command, cwd=cwd, check=True, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{what} took over {COMPILE_TIMEOUT_S:.0f} s") from exc
    return done.stdout


def make_prerequisites(rules: str) -> list[str]:
    """The prerequisites of make rules as `cc -M` writes them (`t.o: a.c b.h \\` newline
    ` c.h`): a backslash-newline continues a rule, `\\ ` is a space in a name, `$$` a `$`."""
    names = []
    for rule in rules.replace("\\\n", " ").splitlines():
        _, colon, prerequisites = rule.partition(": ")
        if colon:
            for name in re.split(r"(?<!\\)\s+", prerequisites.strip()):
                names.append(re.sub(r"\\(.)", r"\1", name).replace("$$", "$"))
    return [n for n in names if n]


def files_read(spec: KernelSource, compiler: str) -> list[Path]:
    """Every file the compiler reads to build `spec`: its units, the headers they include and
    the system headers under those, as its dependency output (`-M`, preprocessing only) says."""
    rules = _run([compiler, *spec.cflags, "-M", *map(str, spec.sources)], spec.home, "cc -M")
    return sorted({(spec.home / name).resolve() for name in make_prerequisites(rules)})


def cache_key(spec: KernelSource, read: Sequence[Path], compiler_id: str) -> str:
    """The bytes of every file read (`files_read`; those in the units' directory by their name
    there, so that two checkouts of the same sources share a library), flags, compiler and CPU
    (model and flags): a library is only ever loaded on the kind of machine, and from the
    compiler and the files, that built it."""
    home = spec.home.resolve()
    parts = []
    for path in sorted(read):
        name = path.relative_to(home) if path.is_relative_to(home) else path
        parts += [str(name).encode(), hashlib.sha256(path.read_bytes()).digest()]
    parts += [
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
    """Each unit to an object (as many at once as there are CPUs), then the library, all
    within COMPILE_TIMEOUT_S."""
    deadline = time.monotonic() + COMPILE_TIMEOUT_S
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / f"{i}-{src.stem}.o" for i, src in enumerate(spec.sources)]
        units = [
            [compiler, *spec.cflags, "-c", str(src), "-o", str(obj)]
            for src, obj in zip(spec.sources, objects, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            for _ in pool.map(lambda unit: _run(unit, spec.home, "compiling", deadline), units):
                pass  # a failed compile raises here
        staged = Path(tmp) / target.name
        link = [compiler, *spec.cflags, "-shared", *map(str, objects), "-o", str(staged), "-lm"]
        _run(link, spec.home, "linking", deadline)
        staged.chmod(0o700)
        write_json_atomically(record_path(target), {"sha256": sha256_file(staged)})
        if target.is_symlink() or target.is_dir():
            target.unlink()  # os.replace would write through neither
        os.replace(staged, target)  # appears complete or not at all


def _manifest(spec: KernelSource, compiler_id: str, home: Path) -> Path:
    """Where `files_read`'s answer for these units (their bytes), flags and compiler is kept."""
    parts = [compiler_id.encode(), " ".join(spec.cflags).encode()]
    for src in spec.sources:
        parts += [src.name.encode(), hashlib.sha256(src.read_bytes()).digest()]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return home / f"{spec.name}-{digest}.files.json"


def _remember(manifest: Path, spec: KernelSource, read: Sequence[Path]) -> None:
    """Files in the units' directory by their name there (another checkout of the same units
    reads its own), the rest by their path."""
    home = spec.home.resolve()
    names = [str(p.relative_to(home) if p.is_relative_to(home) else p) for p in read]
    write_json_atomically(manifest, {"files": names})


def _remembered(manifest: Path, spec: KernelSource) -> list[Path] | None:
    """The files a trusted manifest lists, where every one still exists."""
    if not manifest.exists() or untrusted_reason(manifest) is not None:
        return None
    files = read_json_object(manifest).get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    paths = [spec.home.resolve() / f for f in files]  # an absolute name stays as it is
    return paths if all(p.is_file() for p in paths) else None


def _target(spec: KernelSource, home: Path, read: Sequence[Path], compiler_id: str) -> Path:
    return home / f"{spec.name}-{cache_key(spec, read, compiler_id)}.so"


def load(spec: KernelSource, logger: logging.Logger) -> ctypes.CDLL | None:
    """The compiled library, or None (logged once by the caller's cache) when it cannot run."""
    missing = [f for f in spec.cpu_flags if f not in cpu_flags()]
    if missing:
        logger.info("%s off: CPU lacks %s", spec.label, ", ".join(missing))
        return None
    try:
        compiler = _compiler()
        compiler_id = _compiler_id(compiler)
        home = private_dir(default_cache_dir() / "kernels")
        manifest = _manifest(spec, compiler_id, home)
        read = _remembered(manifest, spec)
        if read is not None and untrusted_library(_target(spec, home, read, compiler_id)) is None:
            return ctypes.CDLL(str(_target(spec, home, read, compiler_id)))
        read = files_read(spec, compiler)
        _remember(manifest, spec, read)
        target = _target(spec, home, read, compiler_id)
        why = untrusted_library(target)
        if why is not None:
            if why != "not built yet":
                logger.warning("%s: rebuilding %s: %s", spec.label, target, why)
            _compile(spec, compiler, target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        logger.warning("%s off: cannot build %s: %s", spec.label, spec.name, detail)
        return None
