from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Two cores are shared with whatever else runs; one intra-op thread keeps tests predictable.
torch.set_num_threads(int(os.environ.get("SPECSERVE_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("tiny-llama"), "llama")


def kernels_expected() -> bool:
    """SPECSERVE_EXPECT_KERNELS=1 or CI=true: a machine where the block kernels must build."""
    expect = os.environ.get("SPECSERVE_EXPECT_KERNELS", "").lower() in ("1", "true", "yes")
    return expect or os.environ.get("CI", "").lower() == "true"


def require_block_kernels() -> None:
    """Skip when the GGUF block kernels are unavailable here; fail instead where they were
    expected (`kernels_expected`), so a broken build cannot pass as a skip."""
    from specserve.kernels import ggml

    if ggml.library() is not None:
        return
    why = "block kernels unavailable here (no AVX2/FMA/F16C or no working C compiler)"
    if kernels_expected():
        pytest.fail(f"{why}, but SPECSERVE_EXPECT_KERNELS=1 or CI=true expects them")
    pytest.skip(why)


@pytest.fixture
def block_kernels() -> None:
    require_block_kernels()
