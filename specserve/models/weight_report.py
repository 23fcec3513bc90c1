"""What a model's weights are and how they run, for the start-up log and `/info`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WeightReport:
    """A GGUF's tensors: bytes per GGUF type in the file, how many run as block rows, and the
    quantised types that run as float32 because no kernel here reads them."""

    bytes_by_type: dict[str, int] = field(default_factory=dict)
    block_tensors: int = 0
    float32_tensors: int = 0
    expanded: dict[str, int] = field(default_factory=dict)  # GGUF type -> tensors expanded
