"""The sampler's per-request processors, on literal logits."""

from __future__ import annotations

import torch

from specserve.request import SamplingParams
from specserve.runner.sampler import SampleRow, pick_tokens, processed_logits

GREEDY = SamplingParams()


def ban(token: int, seen: list[list[int]]):  # type: ignore[no-untyped-def]
    def processor(ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        seen.append(ids)
        logits[token] = float("-inf")
        return logits

    return processor


def test_a_processor_bans_only_in_its_own_row() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))  # [rows, vocab]
    plain = [SampleRow(GREEDY, [], 0) for _ in range(4)]
    want = pick_tokens(logits, plain)
    seen: list[list[int]] = []
    rows = list(plain)
    rows[2] = SampleRow(GREEDY, [1, 2, 3], 0, (ban(want[2], seen),))
    got = pick_tokens(logits, rows)
    assert got[2] == int(logits[2].topk(2).indices[1])  # the runner-up
    assert got[:2] + got[3:] == want[:2] + want[3:]
    assert seen == [[1, 2, 3]]
    assert float(logits[2, want[2]]) != float("-inf")  # the pass's logits are left alone


def test_processors_run_before_the_sampling_parameters() -> None:
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    params = SamplingParams(temperature=1.0, top_k=2, seed=0)
    z = processed_logits(logits, SampleRow(params, [], 0, (ban(0, []),)))
    assert torch.isinf(z[[0, 3]]).all() and torch.isfinite(z[[1, 2]]).all()  # top-2 of the rest


def test_argmax_rows_takes_the_first_maximum_as_torch_does() -> None:
    from specserve.runner.sampler import argmax_rows

    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [-0.0, 0.0, -1.0, 0.0], [2.0, 1.0, 2.0, 2.0]])
    assert argmax_rows(logits).tolist() == [1, 0, 0] == logits.argmax(-1).tolist()
    rows = torch.randn(5, 49152, generator=torch.Generator().manual_seed(0))
    assert torch.equal(argmax_rows(rows), rows.argmax(-1))
    assert argmax_rows(rows).dtype == torch.int64
    assert torch.equal(argmax_rows(rows[:, ::2]), rows[:, ::2].argmax(-1))  # a strided view
