"""The records of one admitted request (`server/service.py`): `Tracked` (its route, timings,
outcome and slots), each choice's output so far (`Choice`), and a finished choice (`Collected`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.outputs import RequestOutput, TokenLogprob
from specserve.server.outcome import Outcome


@dataclass
class Choice:
    """What one choice has produced so far."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    last_token: float | None = None
    final: RequestOutput | None = None


@dataclass
class Tracked:
    route: str
    arrival: float
    outcome: Outcome = Outcome.CANCELLED  # until the engine says otherwise
    first_token: float | None = None
    closed: bool = False
    slots: int = 1  # of --max-concurrent-requests: one per choice
    choices: list[Choice] = field(default_factory=lambda: [Choice()])

    @property
    def final(self) -> RequestOutput | None:
        """Choice 0's last output, once every choice has finished."""
        done = all(c.final is not None for c in self.choices)
        return self.choices[0].final if done else None


@dataclass(frozen=True)
class Collected:
    token_ids: list[int]
    text: str
    final: RequestOutput
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @classmethod
    def of(cls, c: Choice) -> Collected:
        assert c.final is not None
        return cls(c.token_ids, c.text, c.final, c.logprobs, c.prompt_logprobs)
