"""Engine flags shared by `generate` and `serve`. Every flag has an environment-variable form."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from specserve.cli_flags import add_flag, add_switch
from specserve.config import (
    ATTENTION_IMPLS,
    KV_DTYPES,
    NUMERICS,
    POLICIES,
    PROPOSERS,
    CacheConfig,
    EngineConfig,
    SchedulerConfig,
    SpecConfig,
)
from specserve.engine.memory import parse_bytes

MODEL_HELP = (
    "HF directory (config.json + *.safetensors) or .gguf file; unset = embedded "
    "SmolLM2-135M-Instruct"
)


def add_engine_args(p: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Every engine flag: the model, speculation, and the runtime limits."""
    add_flag(p, "--model", "MODEL_ID", None, MODEL_HELP, environ=environ)
    add_speculation_args(p, environ)
    add_proposer_args(p, environ)
    add_runtime_args(p, environ)
    add_limit_args(p, environ)


def add_speculation_args(
    p: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> None:
    add_flag(
        p,
        "--speculate",
        "SPECULATE",
        None,
        "max proposed tokens per sequence per step (0 = speculation off; unset = the number "
        "of Medusa heads when Medusa serves, else 0)",
        int,
        environ=environ,
    )
    add_flag(
        p,
        "--proposer",
        "PROPOSER",
        "auto",
        "who proposes drafts: auto (the draft model if --draft-model is given, else Medusa "
        "heads if the checkpoint has them or --medusa is given, else n-gram), ngram, suffix "
        "(lookup in the request's own context and in recent requests' outputs), draft, "
        "medusa (heads from --medusa, the checkpoint, or the shipped heads for the default "
        "model; n-gram when there are none)",
        choices=PROPOSERS,
        environ=environ,
    )
    add_flag(
        p,
        "--speculation-policy",
        "SPECULATION_POLICY",
        "static",
        "static: every sequence drafts its cap; adaptive: k per sequence and step from live "
        "acceptance and the step cost profiled at start-up (turns speculation off under load)",
        choices=POLICIES,
        environ=environ,
    )
    add_flag(
        p,
        "--speculate-max-batch",
        "SPECULATE_MAX_BATCH",
        None,
        "no speculation in a step where more sequences are running than this",
        int,
        environ=environ,
    )
    add_flag(
        p,
        "--speculate-max-tokens",
        "SPECULATE_MAX_TOKENS",
        None,
        "no speculation in a step that would score more tokens than this (drafts included)",
        int,
        environ=environ,
    )


def add_proposer_args(p: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """What each proposer loads or matches: the draft model, Medusa heads, n-gram length."""
    add_flag(
        p,
        "--draft-model",
        "DRAFT_MODEL",
        None,
        "draft model (HF directory or .gguf) sharing the target's tokenizer",
        environ=environ,
    )
    add_flag(
        p,
        "--medusa",
        "MEDUSA",
        None,
        "Medusa heads directory (config.json with medusa_num_heads + medusa_lm_head.safetensors); "
        "unset: heads beside the model's weights, or the shipped heads for the default model "
        "with --proposer medusa",
        environ=environ,
    )
    add_switch(
        p,
        "--force-medusa",
        "FORCE_MEDUSA",
        "load Medusa heads whose recorded base fingerprint differs from the loaded base (warns)",
        environ=environ,
    )
    add_flag(
        p,
        "--ngram-max",
        "NGRAM_MAX",
        4,
        "longest context suffix the n-gram lookup matches",
        int,
        environ=environ,
    )
    add_flag(
        p,
        "--suffix-cache-tokens",
        "SUFFIX_CACHE_TOKENS",
        1 << 16,
        "suffix proposer: output tokens of recent requests kept for lookup (oldest request "
        "evicted first; about 32 bytes each)",
        int,
        environ=environ,
    )


def add_runtime_args(p: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    add_flag(p, "--device", "DEVICE", "cpu", "cpu, cuda, cuda:N or auto", environ=environ)
    add_switch(
        p,
        "--dense-weights",
        "DENSE_WEIGHTS",
        "run a GGUF model on float32 weights dequantised at load instead of its Q4_1/Q8_0 "
        "blocks through the CPU block kernels (same model; ~5x the bytes per token)",
        environ=environ,
    )
    add_flag(
        p,
        "--numerics",
        "NUMERICS",
        "q8",
        "arithmetic of a GGUF model's block kernels. q8: each activation row quantised to int8 "
        "per 32 values, integer dot products (llama.cpp's numerics, fastest); exact: blocks "
        "expanded to float32, float32 products (HF transformers' outputs up to summation "
        "order). Either way a row's result does not depend on the rows beside it (exact: up "
        "to 24 rows a step); no effect with --dense-weights or non-GGUF models",
        choices=NUMERICS,
        environ=environ,
    )
    add_flag(
        p,
        "--attention",
        "ATTENTION",
        "auto",
        "auto: ragged attention, reading the paged KV cache in place with the CPU kernel where "
        "it runs (CPU, float32), else the padded reference; reference: always the padded "
        "gather + SDPA path (for comparisons)",
        environ=environ,
        choices=ATTENTION_IMPLS,
    )
    add_flag(
        p,
        "--num-threads",
        "NUM_THREADS",
        None,
        "compute threads (torch intra-op and the C kernels); unset = one per CPU this process "
        "may run on, which measured best (2 cores: 1.4x one thread's decode)",
        int,
        environ=environ,
    )


def add_limit_args(p: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """The context window, the step's token budget, the batch and the KV pool."""
    add_flag(
        p,
        "--max-total-tokens",
        "MAX_TOTAL_TOKENS",
        None,
        "context window: prompt + generated tokens (unset = the model's)",
        int,
        environ=environ,
    )
    add_flag(
        p,
        "--max-batch-tokens",
        "MAX_BATCH_TOKENS",
        2048,
        "tokens scored in one forward pass (prefill chunks + decode + drafts)",
        int,
        environ=environ,
    )
    add_flag(
        p,
        "--max-running-requests",
        "MAX_RUNNING_REQUESTS",
        64,
        "sequences decoding at once",
        int,
        environ=environ,
    )
    add_flag(
        p,
        "--max-memory",
        "MAX_MEMORY",
        None,
        "memory budget: bytes (8GiB) or a fraction of free memory (0.8); the KV pool gets what "
        "weights and the measured peak activation leave (overrides --kv-cache-bytes)",
        environ=environ,
    )
    add_flag(
        p,
        "--kv-cache-bytes",
        "KV_CACHE_BYTES",
        "2GiB",
        "bytes for the paged KV cache (268435456, 256MiB, 2GiB), capped at what "
        "--max-running-requests full context windows can use",
        parse_bytes,
        environ=environ,
    )
    add_flag(
        p,
        "--kv-cache-dtype",
        "KV_CACHE_DTYPE",
        "float16",
        "element type of the KV cache where the CPU attention kernel reads it (float32 model on "
        "CPU): float16 rounds each key and value to fp16 as written (half the bytes per token: "
        "twice the tokens in --kv-cache-bytes, half the bytes a long context reads), float32 "
        "keeps them as computed; elsewhere the cache takes the model's dtype",
        choices=KV_DTYPES,
        environ=environ,
    )
    add_switch(
        p,
        "--no-prefix-caching",
        "NO_PREFIX_CACHING",
        "recompute every prompt: no reuse of KV blocks cached from earlier requests' prompts "
        "and outputs (prefix caching is on by default; outputs are the same either way)",
        environ=environ,
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The engine config the flags say; SystemExit naming the problem when they are invalid."""
    try:
        return engine_config(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc


def engine_config(args: argparse.Namespace, resolve_speculate: bool = True) -> EngineConfig:
    """The engine config the flags say; ValueError when they are invalid. An unset --speculate
    is resolved (the Medusa heads' count, which reads the model) unless `resolve_speculate` is
    False: then it counts as 0, enough to check the rest without the model."""
    from specserve.speculation.medusa_resolve import default_speculate

    speculate = args.speculate
    if speculate is None:
        speculate = (
            default_speculate(args.model, args.proposer, args.medusa) if resolve_speculate else 0
        )
    return EngineConfig(
        model=args.model,
        device=args.device,
        dense_weights=args.dense_weights,
        numerics=args.numerics,
        attention=args.attention,
        num_threads=args.num_threads,
        max_model_len=args.max_total_tokens,
        max_memory=args.max_memory,
        cache=CacheConfig(
            max_kv_bytes=args.kv_cache_bytes,
            prefix_caching=not args.no_prefix_caching,
            kv_dtype=args.kv_cache_dtype,
        ),
        scheduler=SchedulerConfig(
            max_batch_tokens=args.max_batch_tokens,
            max_running_requests=args.max_running_requests,
        ),
        spec=SpecConfig(
            speculate=speculate,
            proposer=args.proposer,
            draft_model=args.draft_model,
            medusa=args.medusa,
            force_medusa=args.force_medusa,
            ngram_max=args.ngram_max,
            suffix_cache_tokens=args.suffix_cache_tokens,
            policy=args.speculation_policy,
            max_batch=args.speculate_max_batch,
            max_tokens=args.speculate_max_tokens,
        ),
    )
