"""What the runner hands to proposers (model_runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from tests.tiny import make_tiny_model

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("attention_kernels")


def test_a_steps_hidden_rows_are_its_own(tmp_path: Path) -> None:
    """Proposers keep `RunOutput.hidden` rows without copying (EagleProposer.sync): no later
    step may write into them."""
    runner = ModelRunner(build_model(make_tiny_model(tmp_path), CPU), 64, 16, CPU)
    first = runner.run([RunItem([5, 6, 7], 0, [0], num_logits=2)])
    kept, values = first.hidden[1], first.hidden[1].clone()
    for position in range(3, 8):
        later = runner.run([RunItem([9 + position], position, [0], num_logits=1)])
        assert later.hidden.untyped_storage().data_ptr() != kept.untyped_storage().data_ptr()
    assert torch.equal(kept, values)
