"""`HybridProposer`: per sequence and step, the suffix lookup's draft or the EAGLE head's.

Lookup is nearly free and excellent where the output copies its context; the head costs about
a sixteenth of a target step per drafted token (benchmarks/bench_eagle.py) and is the only one
with something to say on free text. Each source keeps its own online calibration (confidence bucket
-> observed acceptance), fed in `sync` by comparing the draft it proposed, served or not, with
the tokens the target committed (the target's own continuation whichever draft it verified).
Per sequence the lookup proposes first; the head runs only where the lookup's expected accepted
length is below what asking the head has been gaining in that sequence (a running mean, from an
optimistic prior, of the tokens verification accepted of its served drafts, none where it did
not serve or the policy verified none of it, less its drafting cost; once that mean is not
above zero the head is never asked there again and keeps nothing for the sequence), and then
the draft with the larger expected accepted length serves. The draft's confidences
are the chosen source's calibrated probabilities, so the engine's policy reads one scale.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from specserve.request import Sequence
from specserve.speculation.calibration import Calibration
from specserve.speculation.eagle_proposer import EagleProposer
from specserve.speculation.eagle_registration import REGISTRATION as EAGLE
from specserve.speculation.eagle_registration import eagle_proposer
from specserve.speculation.eagle_state import HEAD_TOKEN_COST, head_mean
from specserve.speculation.objective import expected_emitted
from specserve.speculation.proposer import (
    Draft,
    HiddenRows,
    IndexStats,
    Loaded,
    Proposer,
    Registration,
)
from specserve.speculation.suffix import SuffixProposer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Proposed:
    tokens: list[int]
    raw: list[float]  # the source's own confidences, the calibration's keys


class HybridProposer(Proposer):
    name = "hybrid"

    def __init__(self, lookup: SuffixProposer, head: EagleProposer) -> None:
        self.lookup, self.head = lookup, head
        head.gated = False  # asked here on `head_gained`, which counts only drafts it served
        self.calibration = {"lookup": Calibration(), "head": Calibration()}
        self.chosen = {"lookup": 0, "head": 0}
        # seq_id -> each source's draft this step, chosen or not: the committed tokens are the
        # target's own continuation either way, so both sources learn from every step
        self._proposed: dict[int, dict[str, _Proposed]] = {}
        # per sequence, what asking the head gained: the tokens verification accepted of its
        # draft where it served (none where it did not), less what drafting them cost
        self.head_gained = head_mean()
        self._head_served: set[int] = set()  # seq_ids whose draft this step is the head's

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        looked = self.lookup.propose(seqs, ks)
        worth = [_expected(self._calibrated("lookup", d)) for d in looked]
        ask = [
            k if k and worth[i] < self.head_gained.mean(s.seq_id) else 0
            for i, (s, k) in enumerate(zip(seqs, ks, strict=True))
        ]
        heads = self.head.propose(seqs, ask) if any(ask) else [Draft([]) for _ in seqs]
        out = []
        for seq, look, head, value in zip(seqs, looked, heads, worth, strict=True):
            # the head's drafting is paid once asked: the draft expected to keep more serves
            head_value = _expected(self._calibrated("head", head))
            source, draft = ("head", head) if head_value > value else ("lookup", look)
            drafted = {"lookup": look, "head": head}
            self._proposed[seq.seq_id] = {
                name: _Proposed(d.tokens, d.scores) for name, d in drafted.items() if d.tokens
            }
            if not draft.tokens:
                out.append(draft)
                continue
            self.chosen[source] += 1
            if source == "head":
                self._head_served.add(seq.seq_id)
            calibrated = self._calibrated(source, draft)
            out.append(Draft(draft.tokens, draft.probs, calibrated))
        return out

    def _calibrated(self, source: str, draft: Draft) -> list[float]:
        return self.calibration[source].probabilities(draft.scores) if draft.tokens else []

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        self.lookup.sync(seq, hidden)  # every output feeds the lookup's shared arena
        if seq.params.speculate == 0:  # it never drafts: nothing to observe or keep
            return
        self._observe(seq, hidden)
        if self.head_gained.mean(seq.seq_id) > 0.0:
            self.head.sync(seq, hidden)
        else:  # the lookup's worth is never below 0: the head is not asked here again
            self.head.release(seq)

    def _observe(self, seq: Sequence, hidden: torch.Tensor) -> None:
        """Record how each source's draft for `seq` fared: the committed tokens of this step (one
        per hidden row) against it; positions past them were not verified."""
        rows = hidden.reshape(-1, hidden.shape[-1]).shape[0]
        committed = seq.output_ids[len(seq.output_ids) - rows :]
        head_served = seq.seq_id in self._head_served
        self._head_served.discard(seq.seq_id)
        for source, proposed in self._proposed.pop(seq.seq_id, {}).items():
            right = _accepted_prefix(proposed.tokens, committed)
            seen = min(len(proposed.tokens), len(committed))
            self.calibration[source].record(proposed.raw[:seen], right)
            if source == "head":  # nothing gained where the policy verified none of it
                accepted = rows - 1 if head_served else 0
                cost = HEAD_TOKEN_COST * len(proposed.tokens)
                self.head_gained.record(seq.seq_id, accepted - cost)

    def release(self, seq: Sequence) -> None:
        self._proposed.pop(seq.seq_id, None)
        self._head_served.discard(seq.seq_id)
        self.head_gained.release(seq.seq_id)
        self.lookup.release(seq)
        self.head.release(seq)

    def reset(self) -> bool:
        """The lookup's index and what asking the head has gained (both learned from earlier
        requests)."""
        self.lookup.reset()
        self.head_gained.forget()
        return self.head.reset()

    def index_stats(self) -> IndexStats | None:
        return self.lookup.index_stats()


def _accepted_prefix(drafted: list[int], committed: list[int]) -> int:
    """How many leading drafted tokens the target committed (positions past `committed` were not
    verified, so they count as neither)."""
    n = 0
    while n < min(len(drafted), len(committed)) and drafted[n] == committed[n]:
        n += 1
    return n


def _expected(accept: list[float]) -> float:
    """Expected accepted tokens of a draft with these per-token probabilities."""
    return expected_emitted(accept, len(accept)) - 1.0


def _build(loaded: Loaded) -> Proposer | None:
    lookup = SuffixProposer(loaded.config.spec.suffix_cache_tokens)
    head = eagle_proposer(loaded)
    if head is None:
        logger.info("--proposer hybrid: no EAGLE head, the suffix lookup serves alone")
        return lookup
    return HybridProposer(lookup, head)


REGISTRATION = Registration(
    "hybrid",
    _build,
    artifacts=EAGLE.artifacts,
    settings=("suffix_cache_tokens",),
    hidden=HiddenRows.ACCEPTED,
    summary="per sequence and step the suffix lookup's draft or the EAGLE head's, whichever "
    "is expected to keep more tokens",
    artifact_dir=EAGLE.artifact_dir,
    fingerprint=EAGLE.fingerprint,
)
