"""The suffix proposer on literal token sequences: own context, other requests' outputs,
adaptive draft length, bounded memory, release and reset."""

from __future__ import annotations

import torch

from specserve.request import SamplingParams, SeqStatus, Sequence
from specserve.speculation.suffix import SuffixProposer

NO_HIDDEN = torch.zeros(1)


def seq(seq_id: int, prompt: list[int], output: list[int] | None = None) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", prompt, SamplingParams(), output_ids=list(output or []))


def finish(p: SuffixProposer, s: Sequence) -> None:
    s.status = SeqStatus.FINISHED
    p.release(s)


def test_drafts_from_its_own_context_with_length_adapted_to_the_match() -> None:
    p = SuffixProposer()
    s = seq(1, [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    [d] = p.propose([s], [5])
    assert d.tokens == [4, 5, 6]  # matched [1, 2, 3]: at most 3 tokens (spec_factor 1)
    assert d.confidence is not None and len(d.confidence) == 3
    assert all(0 < c < 1 for c in d.confidence)
    [short] = p.propose([seq(2, [7, 1, 9, 1])], [5])
    assert short.tokens == [9]  # a one-token match drafts one token


def test_drafts_from_another_requests_output_and_not_from_its_own_chain() -> None:
    p = SuffixProposer()
    first = seq(1, [50, 51], output=[10, 11, 12, 13, 14, 15, 16])
    p.sync(first, NO_HIDDEN)
    finish(p, first)
    second = seq(2, [60, 61, 10, 11, 12])  # its own context has no earlier [10, 11, 12]
    [d] = p.propose([second], [4])
    assert d.tokens == [13, 14, 15]
    alone = SuffixProposer()
    [none] = alone.propose([seq(3, [60, 61, 10, 11, 12])], [4])
    assert none.tokens == []
    # In flight, a request's own output is in the global arena but never matched there.
    p2 = SuffixProposer()
    running = seq(4, [1], output=[20, 21, 22, 20, 21])
    p2.sync(running, NO_HIDDEN)
    [own] = p2.propose([running], [3])
    assert own.tokens == [22, 20]  # from its own context
    assert p2.global_index.match(torch.tensor([20, 21]).numpy(), exclude_owner=4)[0] == 0


def test_outputs_of_requests_in_flight_are_shared() -> None:
    p = SuffixProposer()
    a = seq(1, [1], output=[30, 31, 32, 33])
    p.sync(a, NO_HIDDEN)  # a is still running
    [d] = p.propose([seq(2, [9, 30, 31])], [2])
    assert d.tokens == [32, 33]


def test_a_drafting_request_never_synced_is_shared_when_it_proposes() -> None:
    """A proposer swapped in mid-request (a live speculation change) saw none of its syncs:
    what a request has output so far reaches the shared arena when it drafts."""
    p = SuffixProposer()
    a = seq(1, [1], output=[30, 31, 32, 33])
    p.propose([a], [2])  # drafts, never synced
    [d] = p.propose([seq(2, [9, 30, 31])], [2])
    assert d.tokens == [32, 33]


def test_more_frequent_continuation_wins_and_scores_higher() -> None:
    p = SuffixProposer()
    for i, tail in enumerate([[7, 8], [7, 8], [7, 9]]):
        s = seq(i, [0], output=[5, 6, *tail])
        p.sync(s, NO_HIDDEN)
        finish(p, s)
    [d] = p.propose([seq(9, [1, 5, 6])], [2])
    assert d.tokens == [7, 8]
    assert d.confidence is not None and d.confidence[0] > d.confidence[1]


def test_global_memory_is_bounded_and_evicts_oldest_request() -> None:
    p = SuffixProposer(cache_tokens=100)
    for i in range(20):
        s = seq(i, [0], output=[1000 + i] * 30)
        p.sync(s, NO_HIDDEN)
        finish(p, s)
        assert p.global_index.num_tokens <= 100
    assert p.global_index.owners() == [17, 18, 19]


def test_release_forgets_own_context_keeps_shared_output_and_reset_clears_it() -> None:
    p = SuffixProposer()
    s = seq(1, [1, 2, 1], output=[40, 41, 42])
    p.propose([s], [2])
    p.sync(s, NO_HIDDEN)
    p.release(s)  # preempted: not finished
    assert 1 not in p._own and p.global_index.chain_size(1) == 3
    s.output_ids.append(43)
    finish(p, s)  # the last committed token is shared on finish
    assert p.global_index.chain_size(1) == 4
    p.reset()
    assert p.global_index.num_tokens == 0
    assert p.propose([seq(2, [8, 40, 41])], [2])[0].tokens == []


def test_a_salted_request_neither_feeds_nor_reads_other_requests_outputs() -> None:
    from dataclasses import replace

    p = SuffixProposer()
    secret = seq(1, [50, 51], output=[10, 11, 12, 13, 14, 15, 16])
    secret.params = replace(secret.params, cache_salt="tenant-a")
    p.sync(secret, NO_HIDDEN)
    finish(p, secret)
    [d] = p.propose([seq(2, [60, 61, 10, 11, 12])], [4])
    assert d.tokens == []  # tenant a's output is not in the shared arena
    public = seq(3, [50, 51], output=[10, 11, 12, 13, 14, 15, 16])
    p.sync(public, NO_HIDDEN)
    finish(p, public)
    guess = seq(4, [60, 61, 10, 11, 12])
    guess.params = replace(guess.params, cache_salt="tenant-b")
    [d] = p.propose([guess], [4])
    assert d.tokens == []  # a salted request drafts from its own context only
    [d] = p.propose([seq(5, [60, 61, 10, 11, 12])], [4])
    assert d.tokens == [13, 14, 15]
