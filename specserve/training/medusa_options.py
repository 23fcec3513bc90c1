"""What a Medusa training run takes and what it reports: the one piece `medusa_data`,
`medusa_train` and `specserve train-medusa` all read, so each imports it downward."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

WORKLOADS = ("code-edit", "summarize", "code-complete", "chat-creative")
# Weighted toward free-form chat, where n-gram lookup has nothing to copy and heads must carry
# speculation; a workload named k times gets k shares of the prompts.
DEFAULT_MIX = ("chat-creative",) * 5 + ("code-complete", "summarize") * 2 + ("code-edit",)


@dataclass(frozen=True)
class TrainOptions:
    prompts: int = 256  # shared out over `workloads`
    new_tokens: int = 128
    epochs: int = 8
    lr: float = 1e-3
    batch_size: int = 64  # positions per step
    heldout_every: int = 8  # every 8th prompt of each workload is held out
    max_prompt_tokens: int = 768  # longer prompts are skipped
    concurrency: int = 32  # sequences generating at once
    seed: int = 1  # workload seed; the benchmarks use 0, and their prompts are excluded
    workloads: tuple[str, ...] = DEFAULT_MIX
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if min(self.prompts, self.new_tokens - 1, self.epochs, self.batch_size) < 1:
            raise ValueError("need prompts, epochs, batch_size >= 1 and new_tokens >= 2")
        if self.heldout_every < 2:
            raise ValueError(f"heldout_every must be >= 2, got {self.heldout_every}")


@dataclass(frozen=True)
class TrainReport:
    train_positions: int
    heldout_positions: int
    draft_vocab_size: int
    loss_before: list[float]  # held-out CE per head, identity heads (= the base's next token)
    loss_after: list[float]
    accuracy: list[float]  # held-out top-1 per head
    mean_accepted: float  # held-out top-1 chain: sum_i P(heads 0..i right)
    mean_accepted_by_workload: dict[str, float]
    collect_s: float
    train_s: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
