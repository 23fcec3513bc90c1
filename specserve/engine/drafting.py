"""A step's drafts: each sequence's cap, proposing so that a failing proposer fails only the
requests it fails for, the prefix of each draft the policy keeps, and releasing what the
proposer keeps for a sequence. Drafts are lists in the order of the step's work, None where a
sequence has none."""

from __future__ import annotations

import logging
from collections.abc import Callable

from specserve.engine.plan import is_decode
from specserve.grammar import GrammarProcessor
from specserve.request import Sequence
from specserve.scheduler.batch import SeqWork
from specserve.speculation.policy import DecodeSeq, SpeculationPolicy, sequence_factor
from specserve.speculation.proposer import Draft, Proposer

logger = logging.getLogger(__name__)

# Ends one request with an error message (the engine's `_fail`).
Fail = Callable[[Sequence, str], None]


def static_caps(seqs: list[Sequence], speculate: int, max_model_len: int) -> list[int]:
    """Drafts each sequence may propose before any policy: the server's N, lowered by the
    request's own `speculate`; k+1 emitted tokens must fit in max_new_tokens and k drafts in
    the context."""
    caps = []
    for seq in seqs:
        cap = speculate if seq.params.speculate is None else min(seq.params.speculate, speculate)
        cap = min(cap, seq.tokens_left - 1, max_model_len - seq.num_tokens)
        caps.append(max(0, cap))
    return caps


def open_caps(
    policy: SpeculationPolicy | None,
    seqs: list[Sequence],
    caps: list[int],
    num_running: int,
    scheduled: int,
) -> list[int]:
    """The scheduler's draft caps after the policy: paused adaptive sequences get none, then
    the policy opens what it expects to pay (`SpeculationPolicy.open`)."""
    if policy is None:
        return caps
    held = [
        bool(c) and not is_static(policy, s) and paused(s) for s, c in zip(seqs, caps, strict=True)
    ]
    policy.stats.paused += sum(held)
    caps = [0 if h else c for h, c in zip(held, caps, strict=True)]
    return policy.open(decode_views(policy, seqs, caps), num_running, scheduled)


def propose(
    proposer: Proposer | None, work: list[SeqWork], vocab_size: int, fail: Fail
) -> list[Draft | None]:
    """Per sequence of `work`: its non-empty draft, if it has draft slots and found one. One
    batched call; if it raises, each sequence proposes alone and those that raise fail. A draft
    longer than its slots or with an id outside the vocabulary fails its request (it would
    otherwise fail the whole forward pass)."""
    out: list[Draft | None] = [None] * len(work)
    spec = [i for i, w in enumerate(work) if w.max_drafts > 0]
    if proposer is None or not spec:
        return out
    try:
        drafts = proposer.propose([work[i].seq for i in spec], [work[i].max_drafts for i in spec])
    except Exception:
        logger.exception("proposer %s failed: proposing for each sequence alone", proposer.name)
        drafts = [_propose_alone(proposer, work[i], fail) for i in spec]
    for i, d in zip(spec, drafts, strict=True):
        w = work[i]
        if len(d.tokens) > w.max_drafts or any(not 0 <= t < vocab_size for t in d.tokens):
            fail(
                w.seq,
                f"proposer {proposer.name} returned an invalid draft: {len(d.tokens)} tokens "
                f"for {w.max_drafts} slots, ids must be in [0, {vocab_size})",
            )
        elif d.tokens and not w.seq.is_finished:
            out[i] = d
    return out


def release(proposer: Proposer | None, seq: Sequence) -> None:
    """Drop what `proposer` keeps for `seq` (finished, preempted, or its proposer replaced);
    never raises: it runs where requests end."""
    try:
        if proposer is not None:
            proposer.release(seq)
    except Exception:
        logger.exception("proposer release failed for %s", seq.request_id)


def force_drafts(work: list[SeqWork], proposed: list[Draft | None]) -> list[Draft | None]:
    """Per sequence of `work` under a grammar that forces the next text: that text's tokens as
    its draft (up to its slots), unless the proposer's draft already starts with them and goes
    further. The other sequences keep `proposed`."""
    out = list(proposed)
    for i, w in enumerate(work):
        constraint = grammar_of(w.seq)
        if constraint is None or w.max_drafts <= 0 or w.seq.is_finished:
            continue
        forced = constraint.forced(w.seq.output_ids, w.max_drafts)
        d = proposed[i]
        if not forced or (d is not None and d.tokens[: len(forced)] == forced):
            continue
        out[i] = Draft(tokens=forced, confidence=[1.0] * len(forced), forced=True)
    return out


def grammar_of(seq: Sequence) -> GrammarProcessor | None:
    return next((p for p in seq.logits_processors if isinstance(p, GrammarProcessor)), None)


def _propose_alone(proposer: Proposer, w: SeqWork, fail: Fail) -> Draft:
    try:
        proposer.release(w.seq)  # whatever the failed batch left half done
        [draft] = proposer.propose([w.seq], [w.max_drafts])
    except Exception as exc:
        logger.exception("proposer %s failed for %s", proposer.name, w.seq.request_id)
        fail(w.seq, f"proposer {proposer.name} failed: {type(exc).__name__}: {exc}")
        return Draft(tokens=[])
    return draft


def is_static(policy: SpeculationPolicy | None, seq: Sequence, draft: Draft | None = None) -> bool:
    """Whether `seq` verifies its whole draft (the static policy, its own request, or forced
    text)."""
    if draft is not None and draft.forced:
        return True
    return policy is None or not policy.adaptive or seq.params.speculation_policy == "static"


# The longest pause, in steps, after drafts the adaptive policy verified none of.
MAX_DRAFT_PAUSE = 32


def paused(seq: Sequence) -> bool:
    """Whether an adaptive sequence sits out proposing this step (and count the step).

    Under load the policy may verify none of a sequence's draft: one more row would cost more
    than its expected accepted tokens return. Proposing it was then wasted work (measured ad hoc
    at 16 at once on free text with the hybrid: ~0.4 s of proposing in a 5 s run, nine in ten
    drafted tokens not verified). So each draft the policy verified none of pauses proposing for
    the sequence, 1, 2, 4, ... up to MAX_DRAFT_PAUSE steps; a verified draft ends the pauses
    (`record_kept`). Only the speed changes: outputs never depend on what was drafted."""
    pause = seq.draft_pause
    if pause.steps_left == 0:
        return False
    pause.steps_left -= 1
    return True


def record_kept(seq: Sequence, kept: int) -> None:
    """A proposed, non-empty draft of which the adaptive policy verified `kept` tokens."""
    pause = seq.draft_pause
    if kept:
        pause.next_pause = 1
        return
    pause.steps_left = pause.next_pause
    pause.next_pause = min(2 * pause.next_pause, MAX_DRAFT_PAUSE)


def decode_views(
    policy: SpeculationPolicy, seqs: list[Sequence], caps: list[int]
) -> list[DecodeSeq]:
    """What the policy sees of each decode sequence before proposing: length, cap, grammar."""
    return [
        DecodeSeq(
            s.num_tokens,
            is_static(policy, s),
            c,
            grammar=grammar_of(s) is not None,
            factor=sequence_factor(s.draft_odds),
        )
        for s, c in zip(seqs, caps, strict=True)
    ]


def keep_prefixes(
    policy: SpeculationPolicy | None,
    work: list[SeqWork],
    proposed: list[Draft | None],
    seconds: float = 0.0,
) -> list[Draft | None]:
    """Per sequence of `work`: the prefix of its draft the policy verifies (static: all of it),
    None for none. `seconds`: what proposing took this step (the policy's payoff)."""
    decode = [i for i, w in enumerate(work) if is_decode(w) and not w.seq.is_finished]
    if policy is None or not decode:
        return proposed
    views = [
        DecodeSeq(
            work[i].seq.num_tokens,
            is_static(policy, work[i].seq, proposed[i]),
            draft=proposed[i],
            factor=sequence_factor(work[i].seq.draft_odds),
        )
        for i in decode
    ]
    prefill = sum(w.num_tokens for w in work if not is_decode(w))
    proposing = sum(
        1 for i, v in zip(decode, views, strict=True) if work[i].max_drafts > 0 and not v.static
    )
    ks = policy.choose(views, prefill, proposing, seconds)
    kept: list[Draft | None] = [None] * len(work)
    for i, k, view in zip(decode, ks, views, strict=True):
        d = proposed[i]
        if d is not None and not view.static:
            record_kept(work[i].seq, k)
        if k and d is not None:
            kept[i] = d.prefix(k)
    return kept
