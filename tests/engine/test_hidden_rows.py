"""The engine hands a proposer's `sync` the hidden states its registration asks for
(`Registration.hidden`): the row that produced the last committed token, or every row of the
step's span up to it (what a drafter on the target's features reads)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from specserve.request import SamplingParams, Sequence
from specserve.speculation import registry
from specserve.speculation.proposer import HiddenRows
from tests.engine.helpers import make_engine, run_all
from tests.engine.test_speculation import LOOPY


def synced(tiny_llama: Path, rows: HiddenRows, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """(tokens committed before the step, tokens after, the hidden tensor) of every sync."""
    kinds = dict(registry.REGISTRY._kinds)
    kinds["ngram"] = replace(kinds["ngram"], hidden=rows)
    monkeypatch.setattr(registry.REGISTRY, "_kinds", kinds)
    engine = make_engine(tiny_llama, speculate=4, proposer="ngram")
    assert engine.res.proposer is not None
    seen: list[Any] = []
    before: dict[int, int] = {}
    sync = engine.res.proposer.sync

    def record(seq: Sequence, hidden: torch.Tensor) -> None:
        seen.append((before.get(seq.seq_id), seq.num_tokens, hidden.clone()))
        before[seq.seq_id] = seq.num_tokens
        sync(seq, hidden)

    monkeypatch.setattr(engine.res.proposer, "sync", record)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    run_all(engine, LOOPY, params)
    drafts = engine.stats.proposer
    assert drafts.accepted_tokens > 0 and drafts.drafted_tokens > drafts.accepted_tokens
    return seen


def test_sync_gets_the_last_row_or_every_accepted_row(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    last = synced(tiny_llama, HiddenRows.LAST_ACCEPTED, monkeypatch)
    every = synced(tiny_llama, HiddenRows.ACCEPTED, monkeypatch)
    assert len(last) == len(every)
    spans = 0
    for (prev, now, one), (_, _, rows) in zip(last, every, strict=True):
        assert one.dim() == 1 and rows.dim() == 2
        if prev is not None:  # a decode step: one row per token it committed
            assert rows.shape[0] == now - prev
            spans += rows.shape[0] > 1
        torch.testing.assert_close(rows[-1], one, rtol=0, atol=0)  # ends at the same row
    assert spans > 0  # some step committed more than one token (accepted drafts)
