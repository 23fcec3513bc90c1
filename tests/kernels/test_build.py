"""Building the block kernels: a machine that cannot build them falls back, and says why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from specserve.kernels import ggml


def test_no_working_compiler_means_no_kernels_and_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(ggml, "_cpu_flags", lambda: {"avx2", "fma", "f16c"})
    ggml.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="specserve.kernels.ggml"):
            assert ggml.library() is None
        assert "GGUF block kernels off: cannot build ggml_blocks.c" in caplog.text
        assert not list(tmp_path.glob("kernels/*.so"))  # nothing half-built is left behind
    finally:
        ggml.library.cache_clear()


def test_a_cpu_without_avx2_gets_no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ggml, "_cpu_flags", lambda: {"sse4_2"})
    ggml.library.cache_clear()
    try:
        assert ggml.library() is None
    finally:
        ggml.library.cache_clear()


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
    from tests.conftest import require_block_kernels

    for name in ("SPECSERVE_EXPECT_KERNELS", "CI"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(ggml, "library", lambda: None)
    with pytest.raises(outcome):
        require_block_kernels()
