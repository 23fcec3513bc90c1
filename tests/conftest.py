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


@pytest.fixture
def block_kernels() -> None:
    """Skip without the GGUF block kernels; fail where they are expected (CI)."""
    from specserve.kernels import ggml
    from tests.kernels.expect import require

    require(ggml.library, "GGUF block kernels")


@pytest.fixture
def attention_kernels() -> None:
    """Skip without the paged attention kernels; fail where they are expected (CI)."""
    from specserve.kernels import attention
    from tests.kernels.expect import require

    require(attention.library, "paged attention kernels")
