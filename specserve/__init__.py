"""specserve: LLM inference with lossless, load-aware speculative decoding."""

from specserve.config import CacheConfig, EngineConfig, SchedulerConfig, SpecConfig
from specserve.llm import LLM, Completion
from specserve.request import SamplingParams

__all__ = [
    "LLM",
    "CacheConfig",
    "Completion",
    "EngineConfig",
    "SamplingParams",
    "SchedulerConfig",
    "SpecConfig",
]
__version__ = "0.1.0"
