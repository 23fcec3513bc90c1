"""specserve: LLM inference with lossless, load-aware speculative decoding."""

from specserve.config import CacheConfig, EngineConfig, SchedulerConfig, SpecConfig
from specserve.llm import LLM, Completion
from specserve.request import GrammarSpec, SamplingParams

__all__ = [
    "LLM",
    "CacheConfig",
    "Completion",
    "EngineConfig",
    "GrammarSpec",
    "SamplingParams",
    "SchedulerConfig",
    "SpecConfig",
]
__version__ = "0.1.0"
