"""Request-level records: sampling parameters and the live sequence state (what a step emits
for a request: outputs.py)."""

from __future__ import annotations

import enum
import math
import time
from collections import abc
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from specserve.history import History as History  # re-exported: the engine's row view
from specserve.history import OutputCounts, SeenTokens

if TYPE_CHECKING:
    import torch


class FinishReason(enum.StrEnum):
    """Why a sequence finished. A `str`: outputs, JSON and metric labels carry the value."""

    EOS = "eos"  # an end-of-sequence token
    STOP = "stop"  # a stop string
    LENGTH = "length"  # max_new_tokens or the context window
    ABORT = "abort"  # aborted: the client went away, or a drain's timeout
    ERROR = "error"  # a failure charged to this request (its output's `error` says which)


# A per-request logits processor: (the token ids before the row's position, prompt and drafts
# before it included: a `History` from the engine, read-only; the row's logits [vocab] float32)
# -> the logits to sample from [vocab]. It may write the row in place. Grammars
# (specserve/grammar.py) plug in here.
LogitsProcessor = Callable[[abc.Sequence[int], "torch.Tensor"], "torch.Tensor"]


GRAMMAR_KINDS = ("json_schema", "regex", "lark")


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint on the output (specserve/grammar.py): every token keeps the text inside it."""

    kind: str  # "json_schema" (source: the schema as JSON text), "regex" or "lark"
    source: str
    # The compiled grammar, set by `Grammars.compile` where the request is prepared: it travels
    # with the request, so the engine's thread copies it and never compiles. Not part of what
    # the spec is (equality, hash, repr).
    compiled: Any = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"grammar kind must be one of {GRAMMAR_KINDS}, got {self.kind!r}")


MAX_PENALTY = 2.0  # presence and frequency penalties lie in [-2, 2] (OpenAI's range)
MAX_LOGIT_BIAS = 100.0  # a logit bias lies in [-100, 100]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    # 0 means greedy (argmax); > 0 samples with the counter-based Gumbel-max rule.
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # over prompt and output (as vLLM and TGI)
    # OpenAI's: logit -= frequency * count + presence * (count > 0), counting only the
    # generated tokens before the row (drafts before it included). Each in [-2, 2].
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # OpenAI's: (token id, value in [-100, 100]) added to that token's logit, ids distinct.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # vLLM's: when sampling, drop tokens less likely than min_p x the most likely one's
    # probability (after temperature). 0 = off.
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Per-request cap on proposed tokens per step; None = the server's N. Never raises above N.
    speculate: int | None = None
    # "static": verify every draft whole (up to the cap) even on an adaptive engine;
    # "adaptive": needs an adaptive engine; None: the engine's policy.
    speculation_policy: str | None = None
    # Log-probabilities of emitted tokens (under the processed distribution the sampler uses):
    # None = none, 0 = the chosen token's, k = it and the k most likely alternatives.
    logprobs: int | None = None
    # Log-probabilities of the prompt's tokens (every position is then computed, none cached).
    prompt_logprobs: bool = False
    # Isolation (vLLM's name): a request reuses cached prompt blocks, and drafts from other
    # requests' outputs, only of requests with the same salt. None: the shared namespace.
    cache_salt: str | None = None
    # Constrained decoding: the output stays inside this grammar, and ends (EOS) where it does.
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(
                f"repetition_penalty must be finite and > 0, got {self.repetition_penalty}"
            )
        self._check_penalties()
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.speculate is not None and self.speculate < 0:
            raise ValueError(f"speculate must be >= 0, got {self.speculate}")
        if self.speculation_policy not in (None, "static", "adaptive"):
            raise ValueError(
                "speculation_policy must be 'static' or 'adaptive', "
                f"got {self.speculation_policy!r}"
            )
        if self.grammar is not None and self.ignore_eos:
            raise ValueError(
                "ignore_eos cannot be combined with a grammar: the output ends where it does"
            )
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        ids = [t for t, _ in self.logit_bias]
        if len(set(ids)) != len(ids) or any(t < 0 for t in ids):
            raise ValueError("logit_bias token ids must be distinct and >= 0")
        if any(not -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS for _, v in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def reads_history(self) -> bool:
        """A penalty reads the tokens before each row."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def plain_greedy(self) -> bool:
        """Greedy on the raw logits: nothing of these parameters moves the argmax."""
        return self.greedy and not self.reads_history and not self.logit_bias

    def for_choice(self, i: int) -> SamplingParams:
        """Choice i of an n-choice request: choice 0 keeps the request's seed, the others get
        seeds derived from it (so each is reproducible alone); greedy choices are all alike."""
        if i == 0 or self.seed is None:
            return self
        return replace(self, seed=choice_seed(self.seed, i))


def choice_seed(seed: int, i: int) -> int:
    """A splitmix64 step of (seed, i): well-spread seeds for choices 1.. of one request."""
    x = (seed + 0x9E3779B97F4A7C15 * (i + 1)) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 31)) >> 1  # 63 bits, as generated seeds are


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SpecCounts:
    """Per-request speculation counts, returned with the output."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0


@dataclass
class DraftPause:
    """Adaptive speculation, per sequence: steps it sits out proposing, and the next pause.
    See `engine/drafting.py` (`paused`, `record_kept`)."""

    steps_left: int = 0
    next_pause: int = 1


@dataclass
class DraftOdds:
    """Adaptive speculation, per sequence: its verified drafts' accepted tokens against what the
    shared calibration expected of them, each sum decayed at every draft. See
    `speculation/policy.py` (`sequence_factor`)."""

    expected: float = 0.0
    accepted: float = 0.0


@dataclass
class Sequence:
    """One request's live state. Tokens = prompt + output; KV holds the first `num_computed`."""

    seq_id: int
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    # the sliding-window layers' blocks of the same positions, where the model has such layers
    # (scheduler/window_blocks.py: behind the window, NULL)
    window_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: FinishReason | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    num_preemptions: int = 0
    spec: SpecCounts = field(default_factory=SpecCounts)
    draft_pause: DraftPause = field(default_factory=DraftPause)
    draft_odds: DraftOdds = field(default_factory=DraftOdds)
    # Prefix cache: leading blocks of block_table already offered to it; once one could not be
    # cached, none after it can be (their keys chain from it).
    cached_blocks: int = 0
    cache_broken: bool = False
    # Applied in order to every logits row scored for this sequence, draft rows included, before
    # the sampling parameters (runner/sampler.py).
    logits_processors: tuple[LogitsProcessor, ...] = ()
    seen: SeenTokens = field(default_factory=SeenTokens, repr=False)  # repetition penalty
    counts: OutputCounts = field(default_factory=OutputCounts, repr=False)  # presence, frequency

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] without building the whole prompt + output list."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    @property
    def tokens_left(self) -> int:
        """Output tokens still allowed by max_new_tokens."""
        return self.params.max_new_tokens - len(self.output_ids)


def check_request(
    ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int, kv_capacity: int
) -> None:
    """Raise ValueError naming the limit a request breaks: empty or out-of-vocabulary prompt,
    no room left in the context window, or more KV slots than the whole cache holds."""
    if not ids:
        raise ValueError("prompt is empty")
    if any(not 0 <= t < vocab_size for t in ids):
        raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
    if len(ids) >= max_model_len:
        raise ValueError(
            f"prompt has {len(ids)} tokens; the context window is {max_model_len} "
            "tokens and at least one must be left to generate"
        )
    if any(t >= vocab_size for t, _ in params.logit_bias):
        raise ValueError(f"logit_bias token ids must be in [0, {vocab_size})")
    total = min(len(ids) + params.max_new_tokens, max_model_len)
    if total > kv_capacity:
        raise ValueError(
            f"prompt ({len(ids)}) + max_new_tokens ({params.max_new_tokens}) needs {total} "
            f"KV slots; the cache holds {kv_capacity} tokens"
        )
