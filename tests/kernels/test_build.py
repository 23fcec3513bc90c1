"""Building the block kernels: a machine that cannot build them falls back, and says why."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from specserve.kernels import attention, build, ggml


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
        assert "GGUF block kernels off: cannot build ggml_blocks.c" in caplog.text
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


def test_cache_key_covers_source_flags_compiler_and_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ggml.KERNEL
    key = build.cache_key(spec, "/usr/bin/cc gcc 12.2.0")
    assert key == build.cache_key(spec, "/usr/bin/cc gcc 12.2.0")
    assert key != build.cache_key(spec, "/usr/bin/cc gcc 13.1.0")
    other_flags = build.KernelSource(spec.source, (*spec.cflags, "-g"), spec.cpu_flags, "x")
    assert key != build.cache_key(other_flags, "/usr/bin/cc gcc 12.2.0")
    monkeypatch.setattr(build, "_cpuinfo", lambda field: f"another {field}")
    assert key != build.cache_key(spec, "/usr/bin/cc gcc 12.2.0")


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
    assert "compiling took over" in caplog.text
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
