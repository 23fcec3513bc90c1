"""EAGLE head and the hybrid proposer: drafting matches the chain training unrolls, the cache
kept across steps equals one pass over the history, artifacts and their base coupling,
the hybrid's choice, and losslessness on the embedded model with the shipped head
(training: tests/training/test_eagle_train.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from specserve.models.registry import build_model
from specserve.request import SamplingParams, Sequence
from specserve.runner.sampler import SampleRow, sample_row
from specserve.speculation import eagle_proposer
from specserve.speculation.eagle_head import (
    EagleConfig,
    EagleHead,
    HeadShape,
    fingerprint,
    load_eagle,
    save_eagle,
)
from specserve.speculation.eagle_proposer import EagleProposer
from specserve.speculation.eagle_state import (
    CATCH_UP_MAX,
    HEAD_PRIOR,
    HEAD_RECHECK,
    HEAD_TOKEN_COST,
)
from specserve.speculation.hybrid import HybridProposer
from specserve.speculation.proposer import Draft
from specserve.training.eagle_data import Batch
from specserve.training.eagle_train import unrolled
from specserve.training.medusa_data import IGNORE

CPU = torch.device("cpu")
HIDDEN, VOCAB = 32, 40


def _head(window: int = 64, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(HeadShape(HIDDEN, 4, 2, 8, 48, 1e-6, 10000.0, window))
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    head.draft_vocab = torch.arange(3, VOCAB, 2)  # odd ids from 3
    return head.eval()


def _target(hidden: int = HIDDEN, vocab: int = VOCAB, head_dim: int = 8) -> Any:
    """What the proposer reads of a target: embeddings, lm_head, sizes."""
    torch.manual_seed(1)
    return SimpleNamespace(
        embed_tokens=torch.nn.Embedding(vocab, hidden),
        lm_head=torch.nn.Linear(hidden, vocab, bias=False),
        arch=SimpleNamespace(vocab_size=vocab, hidden_size=hidden, head_dim=head_dim),
    )


@pytest.fixture
def full_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random heads are unsure of everything: draft every chain to its k."""
    monkeypatch.setattr("specserve.speculation.eagle_state.CONTINUE_ABOVE", 0.0)
    monkeypatch.setattr("specserve.speculation.eagle_proposer.HEAD_TOKEN_COST", 0.0)


def _seq(outputs: list[int], seq_id: int = 0) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", [1, 2, 3], SamplingParams(), output_ids=list(outputs))


@pytest.mark.parametrize("window", [64, 4])
def test_drafts_follow_the_chain_training_unrolls(window: int, full_chains: None) -> None:
    head, target = _head(window), _target()
    proposer = EagleProposer(head, target, None)
    features = torch.randn(12, HIDDEN)
    tokens = [5, 7, 9, 11, 13, 15, 3, 5, 7, 9]  # outputs 0..9 with their features 0..9
    last = len(tokens) - 1
    for start, upto in ((0, 3), (3, 6), (6, 10)):  # steps' spans, each into the cache
        seq = _seq(tokens[:upto])
        proposer.sync(seq, features[start:upto])
        [draft] = proposer.propose([seq], [3])
    assert len(draft.tokens) == 3 and set(draft.tokens) <= set(head.draft_vocab.tolist())
    # Training's chain over (true features 0..9, then anything) with the drafts as tokens:
    # depth j at position 9 + j must pick draft j.
    chain_tokens = tokens + draft.tokens[:2]
    n = len(chain_tokens)
    batch = Batch(
        features=features[:n].unsqueeze(0),
        embeddings=target.embed_tokens(torch.tensor(chain_tokens)).unsqueeze(0),
        targets=torch.full((1, n), IGNORE),
        teacher=torch.zeros(1, n, HIDDEN),
        positions=torch.arange(n).unsqueeze(0),
    )
    with torch.no_grad():
        outs = unrolled(head, batch, 3)
        cols = target.lm_head.weight[head.draft_vocab].T
        for j in range(3):
            logits = outs[j][0, last + j] @ cols
            assert int(head.draft_vocab[logits.argmax()]) == draft.tokens[j]
            assert draft.scores[j] == pytest.approx(float(logits.softmax(-1).max()), rel=1e-4)


@pytest.mark.parametrize("window", [64, 4])
def test_history_kept_across_steps_equals_one_pass(window: int, full_chains: None) -> None:
    head, target = _head(window), _target()
    features = torch.randn(12, HIDDEN)
    tokens = [3 + 2 * (i % 17) for i in range(12)]
    stepwise, once = EagleProposer(head, target, None), EagleProposer(head, target, None)
    done = 0
    for upto, rows in ((1, 1), (3, 2), (4, 1), (8, 4), (12, 4)):  # prefill row, then spans
        seq = _seq(tokens[:upto])
        stepwise.sync(seq, features[upto - rows : upto])
        stepwise.propose([seq], [2])  # moves the pending pairs into the cache
        done = upto
    seq = _seq(tokens[:done])
    once.sync(seq, features[:done])
    a, b = stepwise.propose([seq], [4]), once.propose([seq], [4])
    assert a[0].tokens == b[0].tokens
    assert a[0].scores == pytest.approx(b[0].scores, rel=1e-5)


def test_pending_pairs_past_the_window_are_dropped_in_order(full_chains: None) -> None:
    """Steps synced without a proposal in between (a sequence the head is not asked for) keep
    only the last `window` pairs, in order, whatever spans they came in: the same state, and
    the same draft, as one sync of the whole history."""
    head, target = _head(window=4), _target()
    features = torch.randn(12, HIDDEN)
    tokens = [3 + 2 * (i % 17) for i in range(12)]
    stepwise, once = EagleProposer(head, target, None), EagleProposer(head, target, None)
    upto = 0
    for rows in (1, 2, 3, 1, 4, 1):  # drops whole spans, then part of one
        upto += rows
        stepwise.sync(_seq(tokens[:upto]), features[upto - rows : upto])
        state = stepwise._states[0]
        kept = min(upto, 4)
        assert torch.equal(torch.cat(state.features), features[upto - kept : upto])
        assert state.tokens == tokens[upto - kept : upto] and state.next_pos == upto - kept
    seq = _seq(tokens[:upto])
    once.sync(seq, features[:upto])
    a, b = stepwise.propose([seq], [3]), once.propose([seq], [3])
    assert a[0].tokens and a[0].tokens == b[0].tokens
    assert a[0].scores == pytest.approx(b[0].scores, rel=1e-5)


def test_asked_again_after_sitting_out_the_head_catches_up_on_the_latest_pairs_only(
    full_chains: None,
) -> None:
    """Synced for 48 steps without a proposal (its gate closed), a sequence keeps only the last
    CATCH_UP_MAX pairs, its history starting over there; asked again, the head runs those and
    drafts what a head synced with just those pairs drafts."""
    head, target = _head(window=64), _target()
    features = torch.randn(48, HIDDEN)
    tokens = [3 + 2 * (i % 17) for i in range(48)]
    sat_out, fresh = EagleProposer(head, target, None), EagleProposer(head, target, None)
    sat_out.sync(_seq(tokens[:4]), features[:4])
    assert sat_out.propose([_seq(tokens[:4])], [2])[0].tokens  # the head's keys of 0..3
    for upto in range(5, 49):
        sat_out.sync(_seq(tokens[:upto]), features[upto - 1 : upto])
    waiting = sat_out._states[0]  # what sitting out keeps: the latest pairs, no keys
    assert len(waiting.tokens) == CATCH_UP_MAX and waiting.keys is None
    assert waiting.next_pos == 48 - CATCH_UP_MAX
    seq = _seq(tokens)
    fresh.sync(seq, features[-CATCH_UP_MAX:])
    a, b = sat_out.propose([seq], [3]), fresh.propose([seq], [3])
    state = sat_out._states[0]
    assert state.next_pos == 48 and state.positions is not None
    assert state.positions.tolist() == list(range(48 - CATCH_UP_MAX, 48))
    assert a[0].tokens and a[0].tokens == b[0].tokens
    assert a[0].scores == pytest.approx(b[0].scores, rel=1e-5)


def test_batched_drafts_equal_drafts_alone(full_chains: None) -> None:
    head, target = _head(), _target()
    together, alone = EagleProposer(head, target, None), EagleProposer(head, target, None)
    seqs = [_seq([3 + 2 * ((i * s) % 17) for i in range(n)], s) for s, n in ((0, 5), (1, 9))]
    feats = [torch.randn(len(s.output_ids), HIDDEN) for s in seqs]
    for s, f in zip(seqs, feats, strict=True):
        together.sync(s, f)
        alone.sync(s, f)
    both = together.propose(seqs, [3, 2])
    singles = [alone.propose([s], [k])[0] for s, k in zip(seqs, [3, 2], strict=True)]
    for x, y in zip(both, singles, strict=True):
        assert x.tokens == y.tokens and x.scores == pytest.approx(y.scores, rel=1e-5)


def test_a_gap_or_a_release_starts_the_history_over(full_chains: None) -> None:
    head, target = _head(), _target()
    proposer = EagleProposer(head, target, None)
    seq = _seq([5, 7, 9])
    proposer.sync(seq, torch.randn(3, HIDDEN))
    assert proposer.propose([seq], [2])[0].tokens
    later = _seq([5, 7, 9, 11, 13, 15])  # rows for 3 and 4 never came: a gap
    proposer.sync(later, torch.randn(1, HIDDEN))
    assert proposer._states[0].next_pos == 5 and proposer.propose([later], [2])[0].tokens
    proposer.release(later)
    assert proposer.propose([later], [2])[0].tokens == []  # not synced since: no draft
    with pytest.raises(ValueError, match="feature rows"):
        proposer.sync(_seq([5]), torch.randn(2, HIDDEN))


def test_a_request_that_never_drafts_keeps_no_features() -> None:
    proposer = EagleProposer(_head(), _target(), None)
    off = Sequence(3, "off", [1, 2, 3], SamplingParams(speculate=0), output_ids=[5, 7, 9])
    proposer.sync(off, torch.randn(3, HIDDEN))
    assert proposer._states == {}
    proposer.sync(_seq([5, 7, 9]), torch.randn(3, HIDDEN))
    assert list(proposer._states) == [0]


def _cost_012(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate arithmetic a test spells out (asked at 1.0, 0.73, ...) charges 0.12 a drafted
    token, whatever HEAD_TOKEN_COST is now: the hybrid reads its own copy of the constant."""
    for module in ("eagle_proposer", "hybrid"):
        monkeypatch.setattr(f"specserve.speculation.{module}.HEAD_TOKEN_COST", 0.12)


def test_the_head_stops_drafting_in_a_sequence_where_it_does_not_pay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("specserve.speculation.eagle_state.CONTINUE_ABOVE", 0.0)
    _cost_012(monkeypatch)
    proposer = EagleProposer(_head(), _target(), None)
    seq, other = _seq([5, 7, 9], 0), _seq([5, 7, 11], 1)
    proposer.sync(other, torch.randn(3, HIDDEN))
    proposer.sync(seq, torch.randn(3, HIDDEN))
    drafted = 0
    for _ in range(12):
        [draft] = proposer.propose([seq], [3])
        drafted += bool(draft.tokens)
        wrong = (draft.tokens or [0])[0] + 1  # the target never takes the first draft token
        seq.output_ids.append(wrong)
        proposer.sync(seq, torch.randn(1, HIDDEN))
    # each failed draft of 3 gains -0.36 tokens; the mean from 1.0 turns negative after six
    assert drafted == 6
    assert proposer.gained.mean(0) < 0.0
    assert [len(d.tokens) for d in proposer.propose([seq, other], [3, 3])] == [0, 3]
    proposer.release(seq)
    # forgotten with the sequence: back to the mean over every sequence's outcomes, which six
    # failures of -0.36 moved from 1.0 by 0.05 each (0.95^6 x 1.36 - 0.36)
    assert proposer.gained.mean(0) == pytest.approx(0.95**6 * 1.36 - 0.36)


def test_a_closed_head_is_asked_again_after_catching_up_in_one_call(
    full_chains: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While its gate is closed the head runs nothing for a sequence: the target's features
    wait (the window's last pairs). After HEAD_RECHECK steps it is asked again, both closed
    sequences' pending pairs go in with one batched call, and the drafts are those of a head
    kept caught up every step."""
    calls: list[int] = []
    catch_up = eagle_proposer.padded_catch_up

    def counted(head: Any, embed: Any, states: list[Any], device: Any) -> None:
        calls.append(len(states))
        catch_up(head, embed, states, device)

    monkeypatch.setattr(eagle_proposer, "padded_catch_up", counted)
    head, target = _head(window=4), _target()
    gated, always = EagleProposer(head, target, None), EagleProposer(head, target, None)
    always.gated = False
    seqs = [_seq([5, 7, 9], 0), _seq([5, 7, 11], 1)]
    for s in seqs:
        feats = torch.randn(3, HIDDEN)
        gated.sync(s, feats)
        always.sync(s, feats)
        gated.gained.record(s.seq_id, -5.0)  # closed: 1.0 + 0.2 x (-6)
    for step in range(HEAD_RECHECK):
        for s in seqs:
            s.output_ids.append(3 + 2 * ((step * (s.seq_id + 2)) % 17))
            feats = torch.randn(1, HIDDEN)
            gated.sync(s, feats)
            always.sync(s, feats)
        kept = always.propose(seqs, [2, 2])
        calls.clear()
        drafts = gated.propose(seqs, [2, 2])
        if step < HEAD_RECHECK - 1:
            assert [d.tokens for d in drafts] == [[], []] and calls == []
    assert calls == [2]  # the pending pairs of both sequences, in one call
    for a, b in zip(drafts, kept, strict=True):
        assert a.tokens and a.tokens == b.tokens
        assert a.scores == pytest.approx(b.scores, rel=1e-5)


def test_a_chain_stops_where_the_head_doubts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    head, target = _head(), _target()
    seqs = [_seq([5, 7, 9], 0), _seq([5, 7, 11], 1)]
    full = EagleProposer(head, target, None)
    monkeypatch.setattr("specserve.speculation.eagle_state.CONTINUE_ABOVE", 0.0)
    monkeypatch.setattr("specserve.speculation.eagle_proposer.HEAD_TOKEN_COST", 0.0)
    feats = torch.randn(3, HIDDEN)
    for s in seqs:
        full.sync(s, feats)
    chains = full.propose(seqs, [4, 4])
    threshold = 0.5 * float(torch.tensor(chains[0].scores[:2]).prod())
    monkeypatch.setattr("specserve.speculation.eagle_state.CONTINUE_ABOVE", threshold)
    cut = EagleProposer(head, target, None)
    for s in seqs:
        cut.sync(s, feats)
    a, b = cut.propose(seqs, [4, 4])
    # reach after 2 tokens is above the threshold, after 3 below it: 3 tokens, the third's
    # probability included; the batch-mate's chain is cut where its own reach falls
    assert a.tokens == chains[0].tokens[:3] and a.scores == chains[0].scores[:3]
    reach = torch.tensor(chains[1].scores).cumprod(0)
    n = next((i + 1 for i, r in enumerate(reach.tolist()) if r < threshold), 4)
    assert b.tokens == chains[1].tokens[:n]


def test_sampled_drafts_are_the_samplers_pick_under_the_targets_noise(full_chains: None) -> None:
    head, target = _head(), _target()
    params = SamplingParams(temperature=0.9, seed=7)
    seq = Sequence(0, "r0", [1, 2], params, output_ids=[5, 7, 9])
    proposer = EagleProposer(head, target, None)
    proposer.sync(seq, torch.ones(3, HIDDEN))
    [draft] = proposer.propose([seq], [1])
    assert draft.probs is None  # verified against the target's own sample: bit-identical
    g = proposer._states[0].last
    assert g is not None
    full = torch.full((VOCAB,), float("-inf"))
    full[head.draft_vocab] = proposer.vocab_logits(g)
    want = sample_row(full, SampleRow(params, seq.token_ids, 3)).token
    assert draft.tokens == [want]
    # another seed draws other noise: over a few seeds the pick moves
    picks = set()
    for s in range(8):
        other = Sequence(1 + s, "r", [1, 2], SamplingParams(temperature=5.0, seed=s), [5, 7, 9])
        proposer.sync(other, torch.ones(3, HIDDEN))
        picks.add(proposer.propose([other], [1])[0].tokens[0])
    assert len(picks) > 1


# --------------------------------------------------------------------------------- artifacts
def test_save_load_round_trip_and_foreign_base(
    tmp_path: Path, tiny_llama: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.tiny import make_model_dir

    base = build_model(tiny_llama, CPU)
    shape = HeadShape.for_target(base.arch, 48, 16)
    head = EagleHead(shape)
    head.draft_vocab = torch.tensor([3, 8, 20])
    out = tmp_path / "head"
    save_eagle(head, out, EagleConfig(shape, "tiny", fingerprint(tiny_llama)))
    loaded, cfg = load_eagle(out)
    assert cfg.shape == shape and loaded.draft_vocab.tolist() == [3, 8, 20]
    for name, tensor in head.state_dict().items():
        want = tensor.half().float() if tensor.is_floating_point() else tensor
        assert torch.equal(loaded.state_dict()[name], want), name
    EagleProposer.load(out, base, tiny_llama)  # its own base: accepted
    other = make_model_dir(tmp_path / "other", seed=1, with_tokenizer=False)
    with pytest.raises(ValueError, match="--force-eagle") as err:
        EagleProposer.load(out, build_model(other, CPU), other)
    assert str(fingerprint(tiny_llama)) in str(err.value)
    with caplog.at_level(logging.WARNING, logger="specserve.speculation.eagle_head"):
        EagleProposer.load(out, build_model(other, CPU), other, force=True)
    assert "--force-eagle" in caplog.text


# ------------------------------------------------------------------------------------ hybrid
class _Fixed:
    """A stand-in proposer: the same draft for every sequence; records its calls."""

    def __init__(self, name: str, draft: Draft) -> None:
        self.name, self.draft, self.synced = name, draft, 0
        self.asked: list[list[int]] = []

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        self.asked.append(list(ks))
        return [self.draft.prefix(k) if k else Draft([]) for k in ks]

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        self.synced += 1

    def release(self, seq: Sequence) -> None:
        pass

    def reset(self) -> bool:
        return True

    def index_stats(self) -> None:
        return None


def test_hybrid_takes_a_confident_lookup_and_asks_the_head_elsewhere() -> None:
    sure = _Fixed("suffix", Draft([4, 5, 6], confidence=[0.99, 0.99, 0.99]))
    head = _Fixed("eagle", Draft([7, 8, 9], confidence=[0.6, 0.5, 0.4]))
    hybrid = HybridProposer(sure, head)  # type: ignore[arg-type]
    seq = _seq([1, 2])
    assert hybrid.propose([seq], [3])[0].tokens == [4, 5, 6]
    assert head.asked == []  # the lookup's expected length beat the head's: not asked
    nothing = _Fixed("suffix", Draft([]))
    hybrid = HybridProposer(nothing, head)  # type: ignore[arg-type]
    [draft] = hybrid.propose([seq], [3])
    assert draft.tokens == [7, 8, 9] and head.asked == [[3]]
    # calibrated: the prior for a fresh bucket is (1 + c) / 2
    assert draft.confidence == pytest.approx([0.8, 0.75, 0.7])


def test_hybrid_calibrates_each_source_on_what_the_target_committed() -> None:
    head = _Fixed("eagle", Draft([7, 8, 9], confidence=[0.95, 0.95, 0.95]))
    hybrid = HybridProposer(_Fixed("suffix", Draft([])), head)  # type: ignore[arg-type]
    for step in range(20):
        seq = _seq([1] * (2 + step))
        hybrid.propose([seq], [3])
        committed = _seq([*seq.output_ids, 7, 2])  # first draft right, second wrong
        hybrid.sync(committed, torch.zeros(2, 4))
    row = hybrid.calibration["head"].table()[9]
    assert (row.tested, row.accepted) == (40, 20)
    assert hybrid.calibration["lookup"].table()[9].tested == 0
    assert head.synced == 20
    # one token of each 3-token head draft accepted: 1 - 3 x cost gained, from a prior of 1.0
    gain = 1.0 - 3 * HEAD_TOKEN_COST
    assert hybrid.head_gained.mean(0) == pytest.approx(gain + (1.0 - gain) * 0.8**20)
    hybrid.release(seq)
    assert len(hybrid.head_gained) == 0 and hybrid._proposed == {}


def test_hybrid_learns_from_the_draft_it_did_not_serve() -> None:
    # fresh calibrations (prior (1 + c) / 2): both worth 0.5; a tie keeps the free lookup
    look = _Fixed("suffix", Draft([7], confidence=[0.0]))
    head = _Fixed("eagle", Draft([4], confidence=[0.0]))
    hybrid = HybridProposer(look, head)  # type: ignore[arg-type]
    seq = _seq([1, 2])
    assert hybrid.propose([seq], [2])[0].tokens == [7]  # the lookup serves, the head was asked
    assert head.asked == [[2]] and hybrid.chosen == {"lookup": 1, "head": 0}
    hybrid.sync(_seq([1, 2, 4, 5]), torch.zeros(2, 4))  # the target went the head's way
    head_row, look_row = (
        hybrid.calibration["head"].table()[0],
        hybrid.calibration["lookup"].table()[0],
    )
    assert (head_row.tested, head_row.accepted) == (1, 1)
    assert (look_row.tested, look_row.accepted) == (1, 0)
    # asked and not served, the head gained nothing (right as it was) and cost its drafting
    assert hybrid.head_gained.mean(0) == pytest.approx(1.0 + 0.2 * (0.0 - HEAD_TOKEN_COST - 1.0))


def test_a_served_head_draft_left_unverified_gains_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under load the policy verifies none of a draft: the target's own next token may equal the
    draft's first, but nothing was gained, and both gates count it so."""
    _cost_012(monkeypatch)
    head = _Fixed("eagle", Draft([7, 8, 9], confidence=[0.9, 0.9, 0.9]))
    hybrid = HybridProposer(_Fixed("suffix", Draft([])), head)  # type: ignore[arg-type]
    seq = _seq([1, 2])
    assert hybrid.propose([seq], [3])[0].tokens == [7, 8, 9]  # served
    hybrid.sync(_seq([1, 2, 7]), torch.zeros(1, 4))  # one row: the step's own token only
    assert hybrid.head_gained.mean(0) == pytest.approx(1.0 + 0.2 * (-0.36 - 1.0))
    assert hybrid.calibration["head"].table()[9].accepted == 1  # it would have been right
    monkeypatch.setattr("specserve.speculation.eagle_state.CONTINUE_ABOVE", 0.0)
    eagle = EagleProposer(_head(), _target(), None)
    seq = _seq([5, 7, 9])
    eagle.sync(seq, torch.randn(3, HIDDEN))
    [draft] = eagle.propose([seq], [3])
    seq.output_ids.append(draft.tokens[0])
    eagle.sync(seq, torch.randn(1, HIDDEN))
    assert eagle.gained.mean(0) == pytest.approx(1.0 + 0.2 * (-0.36 - 1.0))


def test_hybrid_stops_asking_the_head_in_a_sequence_where_it_fails() -> None:
    head = _Fixed("eagle", Draft([7, 8, 9], confidence=[0.5, 0.5, 0.5]))
    hybrid = HybridProposer(_Fixed("suffix", Draft([])), head)  # type: ignore[arg-type]
    other = _seq([1, 2], seq_id=1)
    for step in range(12):
        seq = _seq([1] * (2 + step))
        hybrid.propose([seq], [3])
        hybrid.sync(_seq([*seq.output_ids, 2]), torch.zeros(1, 4))  # first draft wrong
    asked = len(head.asked)
    assert asked < 12  # gave up on the head for sequence 0
    hybrid.propose([seq, other], [3, 3])
    assert head.asked[-1] == [0, 3]  # a new sequence still tries it
    synced = head.synced
    hybrid.sync(_seq([*seq.output_ids, 2]), torch.zeros(1, 4))
    assert head.synced == synced  # never asked there again: the head keeps nothing for it


def test_inside_the_hybrid_the_head_does_not_gate_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hybrid decides where to ask the head, on the drafts the head served; the head's own
    gate would count the lookup's accepted tokens as its own, so it is off there."""
    monkeypatch.setattr("specserve.speculation.eagle_state.CONTINUE_ABOVE", 0.0)
    _cost_012(monkeypatch)
    eagle = EagleProposer(_head(), _target(), None)
    hybrid = HybridProposer(_Fixed("suffix", Draft([])), eagle)  # type: ignore[arg-type]
    seq = _seq([5, 7, 9])
    hybrid.sync(seq, torch.randn(3, HIDDEN))
    for _ in range(8):  # every head draft of 3 fails: -0.36 gained each time
        [draft] = hybrid.propose([seq], [3])
        if not draft.tokens:
            break
        seq.output_ids.append((draft.tokens[0] + 1) % VOCAB)
        hybrid.sync(seq, torch.randn(1, HIDDEN))
    assert len(eagle.gained) == 0  # its own gate recorded nothing
    assert hybrid.head_gained.mean(seq.seq_id) < 0.0  # the hybrid's did, and stopped asking
    assert hybrid.chosen["head"] == 6  # asked at 1.0, 0.73, 0.51, 0.34, 0.2, 0.09; not -0.004


# ----------------------------------------------------------------------- real default model
def _real_engine(proposer: str | None, speculate: int, num_blocks: int = 512) -> Any:
    """An engine on the embedded model (loaded once) with the shipped head's proposer."""
    from specserve.speculation.eagle_head import eagle_head_dir
    from specserve.speculation.suffix import SuffixProposer
    from tests.integration.test_real_model import base_engine, engine_with

    engine = engine_with(speculate, num_blocks)
    if proposer is not None:
        res = base_engine().res
        head_dir = eagle_head_dir(res.model_dir, None)
        assert head_dir is not None
        eagle = EagleProposer.load(head_dir, res.model, res.model_dir)
        lookup = SuffixProposer(1 << 16)
        engine.use_proposer(eagle if proposer == "eagle" else HybridProposer(lookup, eagle))
    return engine


@pytest.mark.integration
def test_shipped_head_matches_the_default_model() -> None:
    from specserve.models.loader import resolve_model_dir
    from specserve.speculation.eagle_head import SHIPPED_DIR, eagle_head_dir
    from specserve.speculation.registry import REGISTRY

    model_dir = resolve_model_dir(None)
    assert eagle_head_dir(model_dir, None) == SHIPPED_DIR / "smollm2-135m-instruct"
    _, cfg = load_eagle(SHIPPED_DIR / "smollm2-135m-instruct")
    assert cfg.extra["training"]["train_s"] > 0  # a trained head, with its report
    assert all(k.name not in ("eagle", "hybrid") for k in REGISTRY.candidates("auto"))
    from specserve.models.block_linear import BlockLinear
    from tests.integration.test_real_model import base_engine

    res = base_engine().res
    proposer = EagleProposer.load(SHIPPED_DIR / "smollm2-135m-instruct", res.model, model_dir)
    # drafting reads Q8_0 blocks: the head's projections and the target's own lm_head rows
    assert isinstance(proposer.head.gate_up, BlockLinear)
    assert isinstance(proposer.vocab_logits, BlockLinear)
    assert proposer.vocab_logits.out_features == len(proposer.vocab)


# Pools of 20-26 blocks for 5 requests of 77-89 tokens (26 blocks at their longest): whether
# one is preempted depends on how far each has got when the pool runs out, which moves with
# every accepted draft, so several sizes run and at least one must preempt.
TIGHT_POOLS = (20, 22, 24, 26)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("proposer", "pools"), [("eagle", (512,)), ("eagle", TIGHT_POOLS), ("hybrid", (512,))]
)
def test_shipped_head_greedy_is_bit_identical(proposer: str, pools: tuple[int, ...]) -> None:
    from tests.engine.test_logprobs import run
    from tests.integration.test_real_model import prompts

    ps = (prompts() * 2)[:5]
    params = SamplingParams(max_new_tokens=40, ignore_eos=True, logprobs=2)
    want_tokens, want_lps, _ = run(_real_engine(None, 0), ps, params)  # fails on an error
    preemptions = 0
    for num_blocks in pools:
        engine = _real_engine(proposer, 4, num_blocks)
        tokens, lps, _ = run(engine, ps, params)
        assert tokens == want_tokens and lps == want_lps, num_blocks  # logprobs bit for bit
        stats = engine.stats.proposer
        assert 0 < stats.accepted_tokens < stats.drafted_tokens  # drafted, some rejected
        assert engine.res.allocator.num_free == num_blocks
        eagle = engine.res.proposer if proposer == "eagle" else engine.res.proposer.head
        assert not eagle._states  # every finished sequence released its drafting state
        assert eagle.native is not None and len(eagle.native._free) == eagle.native._lanes
        preemptions += engine.scheduler.num_preemptions
    if pools == TIGHT_POOLS:
        assert preemptions > 0


@pytest.mark.integration
def test_shipped_head_seeded_sampling_is_bit_identical() -> None:
    from tests.engine.helpers import run_all
    from tests.integration.test_real_model import prompts

    params = [
        SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.95, seed=s, ignore_eos=True)
        for s in (1, 2, 3)
    ]
    want = run_all(_real_engine(None, 0), prompts(), params)
    engine = _real_engine("eagle", 4)
    assert run_all(engine, prompts(), params) == want
    stats = engine.stats.proposer
    assert 0 < stats.accepted_tokens < stats.drafted_tokens


def test_reset_forgets_what_the_gates_learned_from_earlier_requests() -> None:
    """A benchmark cell (and POST /reset_suffix_cache) starts the head's gates from their prior:
    what earlier requests taught them (here: drafts that never paid) no longer closes the head
    on the next workload."""
    eagle = EagleProposer(_head(), _target(), None)
    hybrid = HybridProposer(_Fixed("suffix", Draft([])), eagle)  # type: ignore[arg-type]
    for sid in range(40):  # every draft rejected: both shared means fall
        eagle.gained.record(sid, -1.0)
        hybrid.head_gained.record(sid, -1.0)
    assert eagle.gained.mean(99) < HEAD_PRIOR and hybrid.head_gained.mean(99) < HEAD_PRIOR
    assert hybrid.reset() is True
    assert eagle.gained.mean(99) == hybrid.head_gained.mean(99) == HEAD_PRIOR
    assert eagle.gained.mean(0) == HEAD_PRIOR and len(eagle.gained) == 0
