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
