"""Stall-free prefill (Sarathi-Serve): how many prompt tokens a step may compute beside its
decode rows, from the live step cost (runner/cost.py) and the ITL target."""

from __future__ import annotations

from specserve.request import Sequence
from specserve.runner.cost import LiveCost, StepShape

MIN_PREFILL_TOKENS = 32  # prompt tokens a step may always compute, whatever the target


def prefill_budget(
    running: list[Sequence], waiting: bool, budget: int, cost: LiveCost | None, target: float
) -> int:
    """Prompt tokens this step may compute: the token `budget` less a row for each decode
    sequence among `running` (decode rows are never starved), and, with a `target` (seconds),
    a cost model and decode rows to protect, what the live cost predicts fits in it beside
    those rows, but at least MIN_PREFILL_TOKENS so that prompts always move. `waiting`:
    sequences wait to be admitted."""
    decode = [s for s in running if s.num_uncomputed == 1]
    room = max(0, budget - len(decode))
    prefilling = len(decode) < len(running) or waiting
    if cost is None or not target or not prefilling or not decode:  # no stream to stall
        return room
    shape = StepShape.of([(1, s.num_computed) for s in decode], prefill=0)
    return min(room, max(cost.prefill_within(shape, target), MIN_PREFILL_TOKENS))
