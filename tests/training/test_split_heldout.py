"""The train / held-out split both trainers (Medusa, EAGLE) take their continuations through."""

from __future__ import annotations

import pytest
import torch

from specserve.training.medusa_data import Continuation, split_heldout
from specserve.training.medusa_options import TrainOptions


def _cont(heldout: bool) -> Continuation:
    return Continuation("chat", heldout, [1, 2, 3], torch.zeros(2, 4))


def test_split_keeps_each_side_in_order() -> None:
    conts = [_cont(True), _cont(False), _cont(False), _cont(True)]
    train, held = split_heldout(conts, TrainOptions())
    assert train == [conts[1], conts[2]] and held == [conts[0], conts[3]]


@pytest.mark.parametrize("heldout", [True, False])
def test_a_split_with_an_empty_side_says_to_raise_prompts(heldout: bool) -> None:
    with pytest.raises(ValueError, match="raise --prompts"):
        split_heldout([_cont(heldout), _cont(heldout)], TrainOptions(heldout_every=4))
