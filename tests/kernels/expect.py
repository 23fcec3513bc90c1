"""Kernel tests skip where the kernels cannot build, except where they are expected to (CI)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest


def kernels_expected() -> bool:
    """SPECSERVE_EXPECT_KERNELS=1 or CI=true: a machine where every kernel we ship must build."""
    expect = os.environ.get("SPECSERVE_EXPECT_KERNELS", "").lower() in ("1", "true", "yes")
    return expect or os.environ.get("CI", "").lower() == "true"


def require(library: Callable[[], object], what: str) -> None:
    """Skip when `library()` is None here; fail instead where kernels are expected, so a broken
    build cannot pass as a skip."""
    if library() is not None:
        return
    why = f"{what} unavailable here (no AVX2/FMA/F16C or no working C compiler)"
    if kernels_expected():
        pytest.fail(f"{why}, but SPECSERVE_EXPECT_KERNELS=1 or CI=true expects them")
    pytest.skip(why)
