"""The continuations both trainers (Medusa, EAGLE) collect, and the train / held-out split they
take them through."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.bench.workload_items import WorkloadItem
from specserve.request import SamplingParams
from specserve.training.medusa_data import Continuation, collect, recording_engine, split_heldout
from specserve.training.medusa_options import TrainOptions
from tests.engine.helpers import make_engine, run_all


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


def test_a_request_whose_first_token_is_eos_contributes_nothing(tiny_llama: Path) -> None:
    """Collection skips a continuation that ended at its first token (no hidden state was
    recorded for it) and keeps the others."""
    opts = TrainOptions(new_tokens=8)
    items = [WorkloadItem(id=f"p{i}", workload="chat", prompt="x") for i in range(2)]
    prompts = [(items[0], [5, 6, 7]), (items[1], [9, 10, 11, 12])]
    first = run_all(make_engine(tiny_llama), [prompts[0][1]], SamplingParams(max_new_tokens=1))
    engine = recording_engine(tiny_llama, opts, eos_ids=frozenset(first[0]))
    conts = collect(engine, prompts, opts, progress=False)
    assert [len(c.tokens) for c in conts] == [8]  # the second; the first ended at EOS
