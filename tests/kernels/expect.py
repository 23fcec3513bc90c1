"""Kernel tests skip where the kernels cannot build, except where they are expected to (CI)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest


def kernels_expected() -> bool:
    """CI machines and `SPECSERVE_EXPECT_KERNELS=1` must build every kernel we ship."""
    flag = os.environ.get("SPECSERVE_EXPECT_KERNELS")
    if flag is not None:
        return flag not in ("", "0")
    return os.environ.get("CI", "").lower() in ("1", "true")


def requires_kernels(library: Callable[[], object]) -> pytest.MarkDecorator:
    """A skip mark when `library()` is None; a collection failure instead where expected."""
    if library() is None and kernels_expected():
        pytest.fail(f"{library.__module__} did not build, yet kernels are expected here (CI)")
    return pytest.mark.skipif(library() is None, reason="kernels unavailable here")
