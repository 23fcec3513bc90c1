"""The suffix arena against a brute-force reference, its memory bound and eviction order."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from specserve.speculation.suffix_index import TokenArena

Chains = dict[int, list[tuple[int, int]]]  # owner -> [(token, stamp)]


def reference_match(
    chains: Chains, q: list[int], exclude: int
) -> tuple[int, list[tuple[int, int]]]:
    """(depth, [(owner, index)]) by the definition: longest suffix of q ending at a position
    that has a continuation, every occurrence of it."""
    best = 0
    found: list[tuple[int, int]] = []
    for owner, chain in chains.items():
        if owner == exclude:
            continue
        for e in range(len(chain) - 1):
            d = 0
            while d < len(q) and e - d >= 0 and chain[e - d][0] == q[-1 - d]:
                d += 1
            if d > best:
                best, found = d, []
            if d == best and d > 0:
                found.append((owner, e))
    return best, found


def reference_continuation(chains: Chains, occ: list[tuple[int, int]], k: int) -> list[int]:
    out = []
    for _ in range(k):
        nxt = [(o, e + 1) for o, e in occ if e + 1 < len(chains[o])]
        if not nxt:
            break
        counts = Counter(chains[o][e][0] for o, e in nxt)
        top = max(counts.values())
        best = max(
            (chains[o][e][1], chains[o][e][0]) for o, e in nxt if counts[chains[o][e][0]] == top
        )[1]
        out.append(best)
        occ = [(o, e) for o, e in nxt if chains[o][e][0] == best]
    return out


def test_matches_reference_on_random_interleaved_chains() -> None:
    rng = random.Random(0)
    hits = 0
    for case in range(300):
        arena = TokenArena(512, growable=rng.random() < 0.3)
        chains: Chains = {}
        clock = 0
        for _ in range(rng.randint(1, 12)):  # owners append in interleaved runs
            owner = rng.randrange(4)
            run = [rng.randrange(4) for _ in range(rng.randint(1, 8))]
            arena.append(owner, run)
            chains.setdefault(owner, []).extend((t, clock + i) for i, t in enumerate(run))
            clock += len(run)
        q = [rng.randrange(4) for _ in range(rng.randint(1, 6))]
        exclude = rng.choice([-1, 0, 1])
        depth, ends = arena.match(np.array(q), exclude)
        want_depth, want = reference_match(chains, q, exclude)
        assert depth == want_depth, case
        assert len(ends) == len(want), case
        k = rng.randint(0, 5)
        got = arena.continuation(ends, k).tokens.tolist()
        assert got == reference_continuation(chains, want, k), case
        hits += bool(got)
    assert hits > 100


def test_continuation_counts_and_min_share() -> None:
    arena = TokenArena(64)
    arena.append(1, [5, 6, 7, 8])
    arena.append(2, [5, 6, 7, 9])
    arena.append(3, [5, 6, 7, 9])
    depth, ends = arena.match(np.array([5, 6]))
    assert depth == 2 and len(ends) == 3
    c = arena.continuation(ends, 3)
    assert (
        c.tokens.tolist() == [7, 9] and c.support.tolist() == [3, 3] and c.agree.tolist() == [3, 2]
    )
    assert arena.continuation(ends, 3, min_share=0.9).tokens.tolist() == [7]


def test_own_chain_excluded_and_chain_end_is_no_match() -> None:
    arena = TokenArena(64)
    arena.append(7, [1, 2, 3, 1, 2])
    assert arena.match(np.array([1, 2]))[0] == 2  # the earlier [1, 2] continues with 3
    assert arena.match(np.array([1, 2]), exclude_owner=7)[0] == 0
    # [3, 1, 2] occurs only as the chain's end (no continuation): the match is the earlier [1, 2]
    depth, ends = arena.match(np.array([3, 1, 2]))
    assert depth == 2 and ends.tolist() == [1]


def test_memory_bound_evicts_oldest_owner_first() -> None:
    arena = TokenArena(100)
    for owner in range(10):
        arena.append(owner, list(range(owner * 30, owner * 30 + 30)))
        assert arena.num_tokens <= 100
    assert arena.owners() == [7, 8, 9]  # 30 tokens each: the three newest fit
    nbytes = arena.nbytes
    for owner in range(10, 200):
        arena.append(owner % 13, [owner] * 17)
        assert arena.num_tokens <= 100 and arena.nbytes == nbytes
    arena.append(99, list(range(500)))  # longer than the arena: its newest 100 tokens
    assert arena.owners() == [99] and arena.chain_size(99) == 100
    assert arena.match(np.array([498]))[0] == 1 and arena.match(np.array([300]))[0] == 0


def test_eviction_frees_slots_for_reuse_without_stale_links() -> None:
    arena = TokenArena(8)
    arena.append(1, [1, 2, 3, 4])
    arena.append(2, [1, 2, 9, 9])
    arena.append(3, [1, 2, 5, 5])  # evicts owner 1
    depth, ends = arena.match(np.array([1, 2]))
    assert depth == 2
    assert sorted(arena.continuation(ends, 1).tokens.tolist()) == [5]  # newest of the tie
    assert arena.owners() == [2, 3]


def test_growable_arena_keeps_chains_across_growth() -> None:
    arena = TokenArena(4, growable=True)
    tokens = list(range(50)) + list(range(10))
    for i in range(0, len(tokens), 3):
        arena.append(0, tokens[i : i + 3])
    assert arena.capacity >= 60 and arena.chain_size(0) == 60
    depth, ends = arena.match(np.array([7, 8, 9]))
    assert depth == 3 and arena.continuation(ends, 4).tokens.tolist() == [10, 11, 12, 13]


def test_invalid_capacity() -> None:
    with pytest.raises(ValueError):
        TokenArena(0)


def test_appending_token_by_token_or_at_once_builds_the_same_arena() -> None:
    """The suffix proposer's own arena catches up only when it drafts: the chains must not depend
    on how the tokens were split over appends."""
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    one, many = TokenArena(4, growable=True), TokenArena(4, growable=True)
    one.append(7, tokens[:2])
    many.append(7, tokens[:2])
    for t in tokens[2:]:
        one.append(7, [t])
    many.append(7, tokens[2:])
    for name in ("tok", "prev", "next", "owner", "stamp"):
        assert np.array_equal(getattr(one, name), getattr(many, name)), name
    query = np.asarray([5, 9], dtype=np.int32)
    assert one.match(query)[0] == many.match(query)[0] == 2


def test_append_many_builds_the_arena_the_appends_one_by_one_build() -> None:
    """The suffix proposer shares a step's outputs of every sequence in one `append_many`: the
    arrays, chains and later evictions must be those of appending each owner in turn."""
    rng = random.Random(3)
    one, batched = TokenArena(64), TokenArena(64)
    for step in range(40):  # owners come and go; the arena fills and evicts
        owners = rng.sample(range(8), rng.randint(1, 5))
        runs = [(o, [rng.randrange(6) for _ in range(rng.randint(0, 3))]) for o in owners]
        if step % 7 == 6:
            runs.append((owners[0], [1]))  # a repeated owner: one by one
        for owner, tokens in runs:
            one.append(owner, tokens)
        batched.append_many(runs)
        for name in ("tok", "prev", "next", "owner", "stamp", "_free"):
            assert np.array_equal(getattr(one, name), getattr(batched, name)), (step, name)
        assert one.owners() == batched.owners() and one.num_tokens == batched.num_tokens
        assert all(one.chain_size(o) == batched.chain_size(o) for o in range(8))
        query = np.asarray([rng.randrange(6) for _ in range(3)], dtype=np.int32)
        got, want = batched.match(query), one.match(query)
        assert got[0] == want[0] and np.array_equal(got[1], want[1])


def test_a_continuation_from_few_occurrences_counts_as_the_vectorised_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Up to FEW_CONTINUING occurrences the counting runs in Python scalars: the same tokens,
    support and agreement (ties to the newest slot, the min_share stop) as the numpy path."""
    import specserve.speculation.suffix_lookup as module

    rng = random.Random(5)
    compared = 0
    for _ in range(300):
        arena = TokenArena(256)
        for _ in range(rng.randint(2, 10)):
            arena.append(rng.randrange(5), [rng.randrange(3) for _ in range(rng.randint(1, 9))])
        _, ends = arena.match(np.asarray([rng.randrange(3)], dtype=np.int32))
        if not 1 < ends.size <= module.FEW_CONTINUING:
            continue
        k, share = rng.randint(1, 5), rng.choice([0.0, 0.4, 0.6])
        few = arena.continuation(ends, k, share)
        monkeypatch.setattr(module, "FEW_CONTINUING", 0)
        vectorised = arena.continuation(ends, k, share)
        monkeypatch.undo()
        for name in ("tokens", "support", "agree"):
            assert np.array_equal(getattr(few, name), getattr(vectorised, name)), name
        compared += 1
    assert compared > 100
