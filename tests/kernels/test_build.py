"""Building the block kernels: a machine that cannot build them falls back, and says why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from specserve.kernels import build, ggml


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
