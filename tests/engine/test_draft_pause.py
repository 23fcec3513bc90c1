"""Adaptive sequences whose drafts the policy verifies none of pause proposing (drafting.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from specserve.engine.drafting import MAX_DRAFT_PAUSE, paused, record_kept
from specserve.request import SamplingParams, Sequence
from specserve.speculation.proposer import Draft, Proposer
from tests.engine.helpers import make_engine, run_all


class _Counting(Proposer):
    """Drafts [1, 2] for every sequence; counts the steps each sequence was asked."""

    name = "counting"

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        for s in seqs:
            self.asked[s.request_id] = self.asked.get(s.request_id, 0) + 1
        return [Draft([1, 2][:k], confidence=[0.9, 0.9][:k]) for k in ks]

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass


def test_pauses_double_to_the_longest_and_a_kept_draft_ends_them() -> None:
    seq = Sequence(0, "r", [1, 2], SamplingParams())
    asked = []
    for step in range(80):
        if not paused(seq):
            asked.append(step)
            record_kept(seq, 0)
    gaps = [b - a - 1 for a, b in itertools.pairwise(asked)]
    assert gaps == [1, 2, 4, 8, 16, 32, MAX_DRAFT_PAUSE][: len(gaps)]
    record_kept(seq, 0)
    record_kept(seq, 2)  # a verified draft: the next failure pauses one step again
    record_kept(seq, 0)
    assert seq.draft_pause.steps_left == 1


def test_an_adaptive_sequence_whose_drafts_are_never_verified_is_asked_less(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    want = run_all(make_engine(tiny_llama), prompts, SamplingParams(max_new_tokens=24))
    engine = make_engine(tiny_llama, speculate=2, policy="adaptive")
    counting = _Counting()
    engine.use_proposer(counting)
    policy = engine.res.policy
    assert policy is not None
    monkeypatch.setattr(policy, "open", lambda seqs, running, scheduled: [s.cap for s in seqs])
    monkeypatch.setattr(policy, "choose", lambda seqs, prefill, *_: [0] * len(seqs))  # none pays
    params = [
        SamplingParams(max_new_tokens=24),
        SamplingParams(max_new_tokens=24, speculation_policy="static"),
    ]
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    outs: dict[str, list[int]] = {i: [] for i in ids}
    while engine.has_work():
        for out in engine.step():
            outs[out.request_id] += out.new_token_ids
    # adaptive: asked at steps 0, 2, 5, 10, 19 of its 24; static: every step (it verifies all)
    assert counting.asked[ids[0]] == 5
    # its last pause cut short by its end (the last token has no room for drafts: no cap)
    assert policy.stats.paused == 1 + 2 + 4 + 8 + 2
    assert counting.asked[ids[1]] >= 12
    assert [outs[i] for i in ids] == want  # only the speed changes
