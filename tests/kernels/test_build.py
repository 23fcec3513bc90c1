"""Building the kernel libraries: a machine that cannot build them falls back, and says why; the
cache is keyed by every file the compiler reads."""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from specserve.kernels import attention, build, ggml

KERNELS_DIR = Path(ggml.__file__).parent


def test_no_working_compiler_means_no_kernels_and_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(build, "cpu_flags", lambda: {"avx2", "fma", "f16c"})
    ggml.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="specserve.kernels.ggml"):
            assert ggml.library() is None
        assert "GGUF block kernels off: cannot build ggml_blocks" in caplog.text
        assert not list(tmp_path.glob("kernels/*.so"))  # nothing half-built is left behind
    finally:
        ggml.library.cache_clear()


def test_a_cpu_without_avx2_gets_no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "cpu_flags", lambda: {"sse4_2"})
    ggml.library.cache_clear()
    try:
        assert ggml.library() is None
    finally:
        ggml.library.cache_clear()


def _compiler_or_skip() -> str:
    try:
        return build._compiler()
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_cache_key_covers_files_flags_compiler_and_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = attention.KERNEL
    read = build.files_read(spec, _compiler_or_skip())
    key = build.cache_key(spec, read, "/usr/bin/cc gcc 12.2.0")
    assert key == build.cache_key(spec, read, "/usr/bin/cc gcc 12.2.0")
    assert key != build.cache_key(spec, read, "/usr/bin/cc gcc 13.1.0")
    other_flags = build.KernelSource(spec.name, spec.sources, (*spec.cflags, "-g"), (), "x")
    assert key != build.cache_key(other_flags, read, "/usr/bin/cc gcc 12.2.0")
    assert key != build.cache_key(spec, read[:-1], "/usr/bin/cc gcc 12.2.0")
    monkeypatch.setattr(build, "_cpuinfo", lambda field: f"another {field}")
    assert key != build.cache_key(spec, read, "/usr/bin/cc gcc 12.2.0")


def test_make_prerequisites_reads_what_cc_m_writes() -> None:
    rules = "a.o: a.c /usr/include/stdio.h \\\n  my\\ dir/b.h c$$.h\nd.o: d.c a.h\n"
    assert build.make_prerequisites(rules) == [
        "a.c", "/usr/include/stdio.h", "my dir/b.h", "c$.h", "d.c", "a.h"
    ]  # fmt: skip


def _included(sources: tuple[Path, ...]) -> set[Path]:
    """The kernel files `sources` include, directly or through each other, found by reading
    their #include "..." lines: an oracle independent of the compiler's dependency output."""
    seen: set[Path] = set()
    todo = list(sources)
    while todo:
        path = todo.pop()
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
            header = (path.parent / name).resolve()
            if header not in seen:
                seen.add(header)
                todo.append(header)
    return seen


def test_every_kernel_file_is_a_unit_or_read_by_one_and_keys_its_library() -> None:
    compiler = _compiler_or_skip()
    read = {
        spec.name: set(build.files_read(spec, compiler)) for spec in (ggml.KERNEL, attention.KERNEL)
    }
    for spec in (ggml.KERNEL, attention.KERNEL):
        units = {src.resolve() for src in spec.sources}
        assert units | _included(spec.sources) <= read[spec.name], spec.name
    c_files = {p.resolve() for p in KERNELS_DIR.glob("*.c")}
    units = {src.resolve() for spec in (ggml.KERNEL, attention.KERNEL) for src in spec.sources}
    assert c_files == units  # no .c file is left out of every library
    headers = {p.resolve() for p in KERNELS_DIR.glob("*.h")}
    assert headers <= read["ggml_blocks"] | read["paged_attention"]  # none is orphaned
    for header in headers:  # a header declares what its library exports; a unit defines it
        for declaration in _api_declarations(header.read_text()):
            assert declaration.endswith(";"), f"{header.name}: {declaration}"


def _api_declarations(text: str) -> list[str]:
    """Each KERNEL_API declaration or definition, up to its ";" or "{"."""
    return [m.group(0) for m in re.finditer(r"^KERNEL_API[^;{]*[;{]", text, re.M)]


def test_editing_an_included_header_changes_the_key_and_rebuilds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.kernels.expect import require

    require(attention.library, "paged attention kernels")
    copy = tmp_path / "src"
    shutil.copytree(KERNELS_DIR, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    spec = build.KernelSource(
        "paged_attention", tuple(copy / src.name for src in attention.KERNEL.sources),
        attention.KERNEL.cflags, attention.KERNEL.cpu_flags, "copied attention kernel",
    )  # fmt: skip
    compiler = build._compiler()
    nested = copy / "simd.h"  # included by paged_attention.c and by attention_simd.h
    assert nested.resolve() in _included(spec.sources)
    before = build.cache_key(spec, build.files_read(spec, compiler), "cc")
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    compiles: list[Path] = []
    real = build._compile

    def counted(spec: build.KernelSource, compiler: str, target: Path) -> None:
        compiles.append(target)
        real(spec, compiler, target)

    monkeypatch.setattr(build, "_compile", counted)
    logger = logging.getLogger("test")
    listed: list[int] = []
    real_read = build.files_read

    def counted_read(spec: build.KernelSource, compiler: str) -> list[Path]:
        listed.append(1)
        return real_read(spec, compiler)

    monkeypatch.setattr(build, "files_read", counted_read)
    assert build.load(spec, logger) is not None
    assert build.load(spec, logger) is not None  # built: what cc -M said is remembered
    assert (len(compiles), len(listed)) == (1, 1)
    nested.write_text(nested.read_text() + "\n// edited\n")
    assert build.cache_key(spec, real_read(spec, compiler), "cc") != before
    assert build.load(spec, logger) is not None  # the remembered files' key misses: -M again
    assert len(compiles) == 2 and compiles[0] != compiles[1] and len(listed) == 2


def test_a_hanging_compiler_times_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cc = tmp_path / "slow-cc"
    version = '[ "$1" = --version ] && echo "slow-cc 1.0" && exit 0'
    cc.write_text(f"#!/bin/sh\n{version}\nexec sleep 30\n")
    cc.chmod(0o755)
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setattr(build, "COMPILE_TIMEOUT_S", 0.5)
    with caplog.at_level(logging.WARNING, logger="specserve.kernels.attention"):
        assert build.load(attention.KERNEL, attention.logger) is None
    assert "took over" in caplog.text
    assert not list(tmp_path.glob("kernels/*.so"))


@pytest.mark.parametrize(
    ("env", "outcome"),
    [
        ({}, pytest.skip.Exception),
        ({"SPECSERVE_EXPECT_KERNELS": "1"}, pytest.fail.Exception),
        ({"CI": "true"}, pytest.fail.Exception),
    ],
)
def test_missing_kernels_skip_or_fail_where_expected(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], outcome: type[BaseException]
) -> None:
    from tests.kernels.expect import require

    for name in ("SPECSERVE_EXPECT_KERNELS", "CI"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(outcome):
        require(lambda: None, "GGUF block kernels")


def test_a_planted_or_tampered_library_is_rebuilt_not_loaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.kernels.expect import require

    require(attention.library, "paged attention kernels")
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    (tmp_path / "kernels").mkdir(mode=0o755)
    compiles: list[Path] = []
    real = build._compile

    def counted(spec: build.KernelSource, compiler: str, target: Path) -> None:
        compiles.append(target)
        real(spec, compiler, target)

    monkeypatch.setattr(build, "_compile", counted)

    def load() -> bytes:
        with caplog.at_level(logging.WARNING, logger="specserve.kernels.attention"):
            assert build.load(attention.KERNEL, attention.logger) is not None, caplog.text
        (so,) = tmp_path.glob("kernels/*.so")
        assert build.untrusted_library(so) is None
        return so.read_bytes()

    built = load()
    assert len(compiles) == 1
    assert stat.S_IMODE((tmp_path / "kernels").stat().st_mode) == 0o700
    assert load() == built and len(compiles) == 1  # trusted: loaded from the cache
    so = compiles[0]

    def plant() -> None:  # a new file in its place: this process still maps the old one, and
        # rewriting that in place would SIGBUS the process when the mapping is next touched
        planted = so.with_name("planted.so")
        planted.write_bytes(b"planted, not a library")
        os.replace(planted, so)

    def link_elsewhere() -> None:
        so.unlink()
        so.symlink_to(tmp_path / "elsewhere.so")

    tampers = [
        ("differ from the build's record", plant),
        ("writable by group or others", lambda: so.chmod(0o777)),
        ("cannot stat", lambda: build.record_path(so).unlink()),
        ("not a regular file", link_elsewhere),
    ]
    for i, (why, tamper) in enumerate(tampers, start=2):
        tamper()
        caplog.clear()
        assert load() == built and len(compiles) == i
        assert "rebuilding" in caplog.text and why in caplog.text, caplog.text
