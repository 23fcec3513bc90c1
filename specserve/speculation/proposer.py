"""The Proposer protocol, the records proposers hand the engine, and `Registration`: what a
kind of proposer declares about itself once, in its own module (listed in registry.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

import torch

from specserve.config import EngineConfig, SpecConfig
from specserve.models.fingerprint import Fingerprint
from specserve.models.llama import DecoderLM
from specserve.request import Sequence

UNSCORED = 0.5  # the confidence assumed for a token whose proposer gave none


@dataclass(frozen=True)
class Draft:
    """Proposed tokens for one sequence in one step."""

    tokens: list[int]  # 0..k tokens; never padded
    # [len(tokens), vocab] draft distributions q the tokens were sampled from; None when the
    # proposer is deterministic (verification then accepts iff draft == the target's own pick).
    probs: torch.Tensor | None = None
    # [len(tokens)] the proposer's own estimate, in [0, 1], that token i is accepted given tokens
    # before it were (lookup: match length and continuation counts; Medusa: head probability;
    # draft model: q). Calibrated online before the policy trusts it. None: not scored.
    confidence: list[float] | None = None
    # Text a grammar forces (engine/drafting.py `force_drafts`), not the proposer's: verified
    # whole, counted apart, kept out of the proposer's calibration.
    forced: bool = False

    def __post_init__(self) -> None:
        if self.confidence is not None and len(self.confidence) != len(self.tokens):
            raise ValueError(
                f"{len(self.confidence)} confidences for {len(self.tokens)} draft tokens"
            )

    @property
    def scores(self) -> list[float]:
        """Per-token confidence, `UNSCORED` where the proposer gave none."""
        if self.confidence is None:
            return [UNSCORED] * len(self.tokens)
        return self.confidence

    def prefix(self, k: int) -> Draft:
        """The first k tokens (with their q rows and confidences)."""
        if k >= len(self.tokens):
            return self
        probs = self.probs[:k] if self.probs is not None else None
        conf = self.confidence[:k] if self.confidence is not None else None
        return Draft(tokens=self.tokens[:k], probs=probs, confidence=conf, forced=self.forced)


@dataclass
class ProposerStats:
    """Cumulative counters for one proposer."""

    drafts: int = 0  # (sequence, step) pairs that verified at least one drafted token
    drafted_tokens: int = 0  # drafted tokens verified
    accepted_tokens: int = 0
    proposed_tokens: int = 0  # drafted tokens, verified or not (the policy may keep a prefix)
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: steps accepting > i

    def record(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        self.drafts += 1
        self.drafted_tokens += num_drafted
        self.accepted_tokens += num_accepted
        grow = num_drafted - len(self.accepted_per_position)
        self.accepted_per_position += [0] * max(0, grow)
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1


@dataclass(frozen=True)
class IndexStats:
    """A proposer's cross-request token index (the suffix proposer's global arena)."""

    tokens: int
    capacity: int
    bytes: int
    requests: int  # requests with tokens in the index
    drafts_own: int  # proposed drafts found in the request's own context
    drafts_shared: int  # proposed drafts found in other requests' outputs


class Proposer(Protocol):
    """Proposes up to k tokens per sequence. Implementations may keep per-sequence state
    (a draft KV cache); the engine calls `sync` after every step that changed a sequence's
    tokens and `release` when a sequence finishes, aborts or is preempted.

    The capabilities after `release` have defaults for a proposer without the state they
    report on; a proposer subclasses `Proposer` to inherit them."""

    name: str

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        """One Draft per sequence, with len(draft.tokens) <= k. Must not mutate `seqs`."""
        ...

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        """The sequence's committed tokens changed (tokens accepted, rejected ones dropped).
        `hidden` holds the target's final hidden states from the same forward pass that
        verified, as the kind's registration asks (`Registration.hidden`): [hidden_size] at
        the row that produced the last committed token, or with `HiddenRows.ACCEPTED`
        [n, hidden_size] at every row of the step's span up to that one (n = accepted + 1).
        It is a view of rows gathered for this step that nothing writes to later: a proposer
        may keep it without copying (the step's rows stay alive while it does)."""
        ...

    def release(self, seq: Sequence) -> None:
        """Forget all state for `seq`."""
        ...

    def kv_blocks_in_use(self) -> int:
        """Blocks of the proposer's own KV pool held by sequences (a draft model's)."""
        return 0

    def reset(self) -> bool:
        """Forget what was kept from earlier requests; False when the proposer keeps nothing."""
        return False

    def index_stats(self) -> IndexStats | None:
        """The cross-request index, for a proposer that keeps one."""
        return None


class HiddenRows(Enum):
    """Which of the target's final hidden states a proposer reads in `sync`."""

    NONE = "none"
    LAST_ACCEPTED = "last accepted"  # the row that produced the last committed token
    # Every row of the step's span up to that one: a drafter on the target's features (one
    # state per committed position).
    ACCEPTED = "accepted"


@dataclass(frozen=True)
class Target:
    """The loaded target model a proposer pairs with."""

    model: DecoderLM
    model_dir: Path
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    device: torch.device
    dtype: torch.dtype


@dataclass(frozen=True)
class Loaded:
    """What a proposer is built from: the engine's config and what the engine has loaded."""

    config: EngineConfig
    target: Target | None = None  # None: a proposer that needs the target does not apply
    own_model: DecoderLM | None = None  # what the kind's `load_model` returned
    num_blocks: int = 0  # blocks of the target's KV pool


def _no_artifact(settings: Mapping[str, Any], target_dir: Path, live: Proposer | None) -> None:
    del settings, target_dir, live


def _serves_any(proposer: Proposer, spec: SpecConfig) -> None:
    del proposer, spec


@dataclass(frozen=True)
class Registration:
    """One kind of proposer: all that the rest of specserve asks about it."""

    name: str  # `--proposer NAME` and the built proposer's `name`
    # The proposer, or None when this kind does not apply (no draft model given, no heads
    # found): the next candidate serves (`Registry.candidates`).
    build: Callable[[Loaded], Proposer | None]
    # SpecConfig fields naming the artifacts it loads: a live change of one needs a restart.
    artifacts: tuple[str, ...] = ()
    # SpecConfig fields its `build` reads besides those: a live change rebuilds it. Every
    # other field changes live under it (`registry.SHARED_LIVE`).
    settings: tuple[str, ...] = ()
    hidden: HiddenRows = HiddenRows.NONE
    auto: bool = False  # `--proposer auto` tries it (in the registry's order)
    summary: str = ""  # what `--proposer NAME` proposes, for --help
    # A model of its own, loaded before the KV pool is sized: its weights, KV bytes per token
    # and largest step share the memory budget with the target's.
    load_model: Callable[[EngineConfig, Target], DecoderLM | None] | None = None
    # Where its artifact lives, from the speculation settings (SpecConfig's fields, or /info's
    # `speculation`), the target's directory and the live proposer when there is one.
    artifact_dir: Callable[[Mapping[str, Any], Path, Proposer | None], Path | None] = _no_artifact
    # The artifact's fingerprint (directory, digest cache); None: it has no artifact.
    fingerprint: Callable[[Path, Path | None], Fingerprint] | None = None
    # ValueError when the loaded proposer cannot serve a live change to this SpecConfig.
    check_live: Callable[[Proposer, SpecConfig], None] = _serves_any

    @property
    def loads(self) -> bool:
        """Building it loads an artifact (so it never changes live)."""
        return bool(self.artifacts)
