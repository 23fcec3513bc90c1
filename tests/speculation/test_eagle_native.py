"""The EAGLE head's layer in one native call (speculation/eagle_native.py) drafts what the torch
path drafts: the same tokens, confidences equal to float tolerance (another attention kernel),
through histories longer than a lane, gaps, batches of mixed histories and lanes reused."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from specserve.kernels import ggml
from specserve.request import SamplingParams, Sequence
from specserve.speculation.eagle_head import EagleHead, HeadShape
from specserve.speculation.eagle_proposer import EagleProposer
from specserve.speculation.proposer import Draft
from tests.speculation.test_eagle import _target

pytestmark = pytest.mark.skipif(ggml.library() is None, reason="no GGUF block kernels here")

HIDDEN, VOCAB = 64, 96


def _head(window: int) -> EagleHead:
    torch.manual_seed(0)
    head = EagleHead(HeadShape(HIDDEN, 4, 2, 16, 64, 1e-6, 10000.0, window))
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.15)
    head.draft_vocab = torch.arange(3, VOCAB, 2)
    return head.eval()


def _pair(window: int) -> tuple[EagleProposer, EagleProposer]:
    """(native, torch) proposers over copies of one head and one target, q8 blocks both."""
    head, target = _head(window), _target(HIDDEN, VOCAB, head_dim=16)
    native = EagleProposer(copy.deepcopy(head), target, None, blocks=True)
    plain = EagleProposer(copy.deepcopy(head), target, None, blocks=True)
    plain.native = None
    assert native.native is not None
    return native, plain


@pytest.fixture(autouse=True)
def full_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("specserve.speculation.eagle_state.CONTINUE_ABOVE", 0.0)
    monkeypatch.setattr("specserve.speculation.eagle_proposer.HEAD_TOKEN_COST", 0.0)


def _same(a: list[Draft], b: list[Draft]) -> None:
    assert [d.tokens for d in a] == [d.tokens for d in b]
    for x, y in zip(a, b, strict=True):
        assert x.confidence == pytest.approx(y.confidence, abs=1e-3)


def _same_outputs(native: EagleProposer, plain: EagleProposer) -> None:
    """The head's output at each sequence's newest verified position agrees to rounding (~1e-7
    here): a random head's drafts can survive attention over the wrong keys, its outputs not
    (0.08 apart with a lane reading another lane's blocks)."""
    assert native._states.keys() == plain._states.keys()
    for sid, state in native._states.items():
        other = plain._states[sid].last
        assert state.last is not None and other is not None
        torch.testing.assert_close(state.last, other, rtol=0.0, atol=1e-5)


def _play(
    proposers: tuple[EagleProposer, ...],
    steps: list[list[tuple[int, int, int]]],
    params: SamplingParams | None = None,
) -> int:
    """Each step: per sequence (seq id, new tokens, k) sync that many rows, then propose all
    at once on every proposer; the drafts must agree. Returns how many drafts were compared."""
    gen = torch.Generator().manual_seed(7)
    seqs: dict[int, Sequence] = {}
    compared = 0
    for step in steps:
        batch, ks = [], []
        for sid, new, k in step:
            seq = seqs.setdefault(sid, Sequence(sid, f"r{sid}", [1, 2], params or SamplingParams()))
            seq.output_ids += torch.randint(0, VOCAB, (new,), generator=gen).tolist()
            feats = torch.randn(new, HIDDEN, generator=gen)
            for p in proposers:
                p.sync(seq, feats)
            batch.append(seq)
            ks.append(k)
        drafts = [p.propose(batch, ks) for p in proposers]
        for other, p in zip(drafts[1:], proposers[1:], strict=True):
            _same(drafts[0], other)
            _same_outputs(proposers[0], p)
        compared += sum(len(d.tokens) for d in drafts[0])
    return compared


def test_native_drafts_equal_the_torch_paths_over_long_histories() -> None:
    native, plain = _pair(window=8)
    assert native.native is not None
    capacity = native.native.capacity
    # 1-3 accepted a step for ~3 lanes' worth of positions: lanes move their keys many times
    steps = [[(0, 1 + i % 3, 4)] for i in range(3 * capacity // 2)]
    assert _play((native, plain), steps) == 4 * len(steps)


def test_native_batches_of_mixed_histories_gaps_and_reused_lanes() -> None:
    native, plain = _pair(window=16)
    assert native.native is not None
    steps = [[(s, 5 + 3 * s, 3) for s in range(3)]]
    steps += [[(s, 1 + (s + i) % 4, 2 + s) for s in range(3)] for i in range(12)]
    _play((native, plain), steps)
    # a gap: sequence 1's next rows skip positions, and both paths start its history over
    seq = Sequence(1, "r1", [1, 2], SamplingParams(), output_ids=list(range(3, 80)))
    for p in (native, plain):
        p.sync(seq, torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(3)))
    _same(native.propose([seq], [4]), plain.propose([seq], [4]))
    _same_outputs(native, plain)  # one lane (not the first): its own blocks
    # more sequences than the cache first had lanes for; then every lane is returned
    many = [[(10 + s, 4, 3) for s in range(12)], [(10 + s, 2, 3) for s in range(12)]]
    _play((native, plain), many)
    for sid in [0, 1, 2, *range(10, 22)]:
        native.release(Sequence(sid, "x", [1], SamplingParams()))
    assert len(native.native._free) == native.native._lanes >= 15


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy chain", "sampled steps"])
def test_every_lane_has_room_for_the_longest_chain_in_the_batch(sampled: bool) -> None:
    """A chain's rows run for every sequence while any drafts on, so a lane with room only for
    its own short chain would overflow beside a long one (it raised, failing the step): one
    sequence drafting 1 a step beside one drafting the most a lane allows, through several
    lane moves, greedy (the native chain) and seeded sampling (a native layer call a step)."""
    native, plain = _pair(window=8)
    assert native.native is not None
    longest = native.native.max_chain
    steps = [[(0, 1, 1), (1, 1, longest)] for _ in range(3 * native.native.capacity)]
    params = SamplingParams(temperature=0.8, seed=5) if sampled else None
    assert _play((native, plain), steps, params) == len(steps) * (1 + longest)


def test_native_chains_stop_where_the_torch_paths_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain stops once its probability falls below CONTINUE_ABOVE, each sequence on its own,
    in the native chain as in the Python loop: this random head gives each token ~0.025, so at
    0.001 a chain holds two tokens (or its k, if fewer)."""
    monkeypatch.setattr("specserve.speculation.eagle_state.CONTINUE_ABOVE", 0.001)
    native, plain = _pair(window=16)
    gen = torch.Generator().manual_seed(1)
    seqs = [Sequence(s, f"r{s}", [1, 2], SamplingParams(), output_ids=list(range(3, 20)))
            for s in range(3)]  # fmt: skip
    for seq in seqs:
        feats = torch.randn(17, HIDDEN, generator=gen)
        for p in (native, plain):
            p.sync(seq, feats)
    drafts = native.propose(seqs, [1, 3, 5])
    _same(drafts, plain.propose(seqs, [1, 3, 5]))
    assert [len(d.tokens) for d in drafts] == [1, 2, 2]


def test_a_nan_feature_drafts_what_the_torch_path_drafts() -> None:
    """A NaN feature row makes every score of the head's next row NaN, so no score equals the
    row's max: the native pick searched past the row for one and crashed the process. Both
    paths now take the first place with a NaN probability, and the chain runs to its k."""
    native, plain = _pair(window=16)
    seq = Sequence(0, "r0", [1, 2], SamplingParams(), output_ids=list(range(3, 12)))
    feats = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(2))
    feats[-1] = float("nan")
    for p in (native, plain):
        p.sync(seq, feats)
    (a,), (b,) = native.propose([seq], [3]), plain.propose([seq], [3])
    assert a.tokens == b.tokens and len(a.tokens) == 3
    assert a.confidence and b.confidence
    assert all(math.isnan(c) for c in a.confidence + b.confidence)


def test_the_chain_refuses_embeddings_that_do_not_match_the_scores() -> None:
    """The C chain reads a picked place's embedding row by the scores' count of rows: one row
    short would read past the tensor, so the call refuses it before running."""
    native, _ = _pair(window=16)
    seq = Sequence(0, "r0", [1, 2], SamplingParams(), output_ids=list(range(3, 12)))
    native.sync(seq, torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(2)))
    native.vocab_embed = native.vocab_embed[:-1]
    with pytest.raises(ValueError, match="must match its lm_head rows"):
        native.propose([seq], [3])
