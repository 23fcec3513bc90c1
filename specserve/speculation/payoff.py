"""Whether proposing has paid lately, engine-wide; a pause on proposing when it has not.

The adaptive policy keeps the part of each draft whose expected tokens beat its rows' cost. What
it cannot weigh is the proposing itself (the lookups, the head's passes): paid before any draft
is seen, whatever is kept. On free text under load that work can cost more than the kept rows
save (chat-creative, 16 at once, the hybrid: proposing took 1.1-1.9 ms of a ~25 ms step for 2 %
fewer steps, ad hoc). So each step that proposed (adaptive sequences only) is scored by what it
emitted, against the same step without drafts:

    realised = (n + accepted) / (c(the step) + proposing seconds)   against   n / c(no draft rows)

n the step's decoding sequences (each emits one token without drafts), c the live step cost
(runner/cost.py). Over WINDOW such steps the two sides are summed; when proposing came out
behind, it pauses for the whole engine: FIRST_PAUSE steps, then twice as many each time it
keeps losing, up to MAX_PAUSE; a window that pays resets the pause. Only speed changes: outputs
never depend on what was drafted.
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW = 16  # proposing steps per verdict
FIRST_PAUSE = 16  # steps without proposing after the first losing window
MAX_PAUSE = 256


@dataclass
class Payoff:
    tokens: float = 0.0  # emitted by the decoding sequences of the window's proposing steps
    seconds: float = 0.0  # those steps' cost, draft rows and proposing included
    base_tokens: float = 0.0  # what they emit without drafts (one a sequence)
    base_seconds: float = 0.0  # their cost without draft rows or proposing
    steps: int = 0  # proposing steps in the window so far
    pause_left: int = 0  # steps left in the current pause
    next_pause: int = FIRST_PAUSE

    def paused(self) -> bool:
        """Whether this step sits out proposing (the call counts the step)."""
        if self.pause_left == 0:
            return False
        self.pause_left -= 1
        return True

    def record(
        self, decoding: int, accepted: int, seconds: float, base_seconds: float
    ) -> bool | None:
        """A proposing step: `decoding` sequences decoded, `accepted` drafted tokens were
        accepted, `seconds` its cost with drafts and proposing, `base_seconds` without. Returns
        the window's verdict when this step closes one (True: proposing paid), else None."""
        if decoding < 1 or seconds <= 0.0 or base_seconds <= 0.0:
            return None
        self.tokens += decoding + accepted
        self.seconds += seconds
        self.base_tokens += decoding
        self.base_seconds += base_seconds
        self.steps += 1
        if self.steps < WINDOW:
            return None
        paid = self.tokens / self.seconds >= self.base_tokens / self.base_seconds
        if paid:
            self.next_pause = FIRST_PAUSE
        else:
            self.pause_left = self.next_pause
            self.next_pause = min(2 * self.next_pause, MAX_PAUSE)
        self.tokens = self.seconds = self.base_tokens = self.base_seconds = 0.0
        self.steps = 0
        return paid
