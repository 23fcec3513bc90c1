"""Per-request logits processors (the sampler's hook): applied to every row scored for their
request, draft rows included, before the sampling parameters; other requests never see them."""

from __future__ import annotations

from collections import Counter, abc
from pathlib import Path

import pytest
import torch

from specserve.engine.engine import Engine
from specserve.outputs import RequestOutput
from specserve.request import LogitsProcessor, SamplingParams, Sequence
from specserve.speculation.proposer import Draft, Proposer
from tests.engine.helpers import assert_no_kv_held, make_engine

LOOPY = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9], [12, 13, 14, 15, 16, 12, 13]]
GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True, logprobs=2)
SEEDED = SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=0.8, seed=7, logprobs=2)


class Ban:
    """Masks one token to -inf; keeps the ids each row it processed came after."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.seen: list[list[int]] = []

    def __call__(self, ids: abc.Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        self.seen.append(list(ids))
        logits[self.token] = float("-inf")
        return logits


def unchanged(ids: abc.Sequence[int], logits: torch.Tensor) -> torch.Tensor:
    del ids
    return logits


class Insist(Proposer):
    """Drafts `token` in every slot of every sequence."""

    name = "insist"

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        return [Draft([self.token] * k) for k in ks]

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        del seq, hidden

    def release(self, seq: Sequence) -> None:
        del seq


def run(
    engine: Engine,
    params: SamplingParams,
    processors: dict[int, tuple[LogitsProcessor, ...]] | None = None,
) -> list[RequestOutput]:
    """LOOPY at once, request i with processors[i]; each request's outputs merged into one."""
    processors = processors or {}
    ids = [
        engine.add_request(p, params, logits_processors=processors.get(i, ()))
        for i, p in enumerate(LOOPY)
    ]
    merged: dict[str, RequestOutput] = {}
    while engine.has_work():
        for out in engine.step():
            before = merged.get(out.request_id)
            merged[out.request_id] = before.then(out) if before is not None else out
    assert_no_kv_held(engine)
    return [merged[i] for i in ids]


def tokens(outs: list[RequestOutput]) -> list[list[int]]:
    return [o.new_token_ids for o in outs]


def most_common(ids: list[int]) -> int:
    return Counter(ids).most_common(1)[0][0]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("speculate", [0, 3])
def test_banned_token_is_never_emitted(
    tiny_llama: Path, speculate: int, params: SamplingParams
) -> None:
    want = run(make_engine(tiny_llama, speculate=speculate), params)
    banned = most_common(want[0].new_token_ids)
    ban = Ban(banned)
    got = run(make_engine(tiny_llama, speculate=speculate), params, {0: (ban,)})
    assert banned not in got[0].new_token_ids
    assert got[0].new_token_ids != want[0].new_token_ids
    assert tokens(got[1:]) == tokens(want[1:])  # the other rows of the same batches
    if not speculate:  # (with drafts, the shapes of the pass change with request 0's drafts)
        assert [o.logprobs for o in got[1:]] == [o.logprobs for o in want[1:]]
    # Each emitted token's row saw exactly the ids before it.
    ids = LOOPY[0] + got[0].new_token_ids
    for t in range(len(got[0].new_token_ids)):
        assert ids[: len(LOOPY[0]) + t] in ban.seen


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_drafts_of_a_banned_token_are_rejected(tiny_llama: Path, params: SamplingParams) -> None:
    want = run(make_engine(tiny_llama), params)
    banned = most_common(want[0].new_token_ids)
    alone = run(make_engine(tiny_llama), params, {0: (Ban(banned),)})
    engine = make_engine(tiny_llama, speculate=3, policy="static")  # every draft verified
    engine.use_proposer(Insist(banned))
    ban = Ban(banned)
    got = run(engine, params, {0: (ban,)})
    assert got[0].drafted_tokens > 0 and got[0].accepted_tokens == 0
    assert got[0].new_token_ids == alone[0].new_token_ids
    assert tokens(got[1:]) == tokens(want[1:])
    # A draft row's ids end with the draft tokens before it.
    assert any(seen[-1] == banned for seen in ban.seen)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("speculate", [0, 3])
def test_a_processor_that_changes_nothing_changes_no_bit(
    tiny_llama: Path, speculate: int, params: SamplingParams
) -> None:
    # static: both sides verify the same rows (the adaptive policy's timing-fed choices would
    # not, and the tiny dense model's log-probabilities are not invariant to the rows beside)
    want = run(make_engine(tiny_llama, speculate=speculate, policy="static"), params)
    every: dict[int, tuple[LogitsProcessor, ...]] = {i: (unchanged,) for i in range(len(LOOPY))}
    got = run(make_engine(tiny_llama, speculate=speculate, policy="static"), params, every)
    assert tokens(got) == tokens(want)
    assert [o.logprobs for o in got] == [o.logprobs for o in want]
