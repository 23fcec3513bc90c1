"""The /info response: model, limits, speculation (policy, cost, calibration, suffix index),
the speculation profile, fingerprints and the memory budget."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class CostFit(BaseModel):
    intercept_s: float = Field(..., description="least-squares c(0): the step's fixed cost")
    per_token_s: float = Field(..., description="least-squares slope: seconds per scored token")


class CostCurveInfo(BaseModel):
    tokens: list[int] = Field(..., description="T: decode/verify rows of a profiled step")
    seconds: list[float] = Field(
        ..., description="f(T): its attention-free cost, isotonic fit of the profiled steps"
    )
    fit: CostFit
    context: int = Field(0, description="cached tokens per sequence in the profiled steps")
    per_seq_key_s: float = Field(0.0, description="seconds per cached key of a decode sequence")
    per_row_key_s: float = Field(0.0, description="seconds per (scored row, cached key)")
    per_prefill_token_s: float = Field(0.0, description="seconds per prefill-chunk token")
    profile_s: float = Field(0.0, description="start-up profiling time")


class LiveCostCell(BaseModel):
    batch: int = Field(..., description="B: decode sequences in the step")
    rows: int = Field(..., description="T: their rows, drafts included")
    steps: int = Field(..., description="decode-only steps observed with this (B, T)")
    observed_s: float = Field(..., description="running mean of the measured forward pass")
    profiled_s: float = Field(..., description="running mean of the profile's prediction")
    ratio: float = Field(..., description="running mean of observed / profiled")


class LiveCostInfo(BaseModel):
    decode_ratio: float = Field(..., description="observed / profiled over decode-only steps")
    decode_steps: int
    prefill_ratio: float = Field(..., description="observed / profiled over steps with prefill")
    prefill_steps: int
    cells: list[LiveCostCell] = Field(..., description="the live curve, per (B, T) observed")


class SuffixCacheInfo(BaseModel):
    tokens: int = Field(..., description="recent requests' output tokens held for lookup")
    capacity: int = Field(..., description="--suffix-cache-tokens: the bound")
    bytes: int = Field(..., description="memory of the index at the bound")
    requests: int = Field(..., description="requests whose output it holds")
    drafts_own: int = Field(..., description="drafts proposed from the request's own context")
    drafts_shared: int = Field(..., description="drafts proposed from other requests' outputs")


class CalibrationBucket(BaseModel):
    low: float = Field(..., description="confidence bucket [low, high)")
    high: float
    tested: int = Field(..., description="draft tokens in the bucket that verification reached")
    accepted: int
    mean_confidence: float = Field(..., description="the proposer's own prediction")
    observed: float | None = Field(..., description="accepted / tested")
    calibrated: float = Field(..., description="the probability the policy uses")


class PayoffClass(BaseModel):
    min_batch: int = Field(..., description="the class: batch sizes min_batch..2*min_batch-1")
    steps: int = Field(..., description="steps recorded in which adaptive sequences proposed")
    paid: float = Field(
        ...,
        description="the predicted rate with drafts and the seconds of proposing over the rate "
        "without either, from running sums; below 0.98 the class stops proposing but for one "
        "step in 16",
    )


class SpeculationInfo(BaseModel):
    speculate: int = Field(..., description="server-wide N: max drafted tokens per step")
    proposer: str | None = Field(..., description="active proposer; null when speculation is off")
    configured_proposer: str
    draft_model: str | None
    policy: str = Field(..., description="static (every sequence drafts its cap) or adaptive")
    max_batch: int | None = Field(
        default=None, description="gate: no drafts when more sequences run than this"
    )
    max_tokens: int | None = Field(
        default=None, description="gate: no drafts when the step would score more tokens"
    )
    cost_curve: CostCurveInfo | None = Field(
        default=None, description="the step cost model profiled at start-up (adaptive policy)"
    )
    live_cost: LiveCostInfo | None = Field(
        default=None, description="the same model corrected by the engine's own step timings"
    )
    calibration: list[CalibrationBucket] = Field(
        default_factory=list,
        description="the proposer's confidence -> observed acceptance, per bucket",
    )
    suffix_cache: SuffixCacheInfo | None = Field(
        default=None, description="the suffix proposer's cross-request index"
    )
    proposed_tokens: int = Field(0, description="drafted tokens, verified or not")
    trimmed_tokens: int = Field(0, description="proposed tokens the adaptive policy did not verify")
    skipped_steps: int = Field(0, description="adaptive: steps not proposed, as no draft could pay")
    unpaid_steps: int = Field(
        0, description="adaptive: steps not proposed, as proposing has not paid at that batch size"
    )
    payoff: list[PayoffClass] = Field(
        default_factory=list,
        description="adaptive: what proposing did to the predicted rate, per batch-size class",
    )
    paused_sequence_steps: int = Field(
        0,
        description="adaptive: sequence-steps not proposed, paused after drafts the policy "
        "verified none of",
    )
    proposer_call_ms: float | None = Field(
        None,
        description="adaptive: what one proposer call costs per sequence (ms, running mean of "
        "measured calls), priced beside the verified rows; null before a call was measured",
    )


class ProfileInfo(BaseModel):
    path: str
    workload: str = Field(..., description="the profile's workload whose setting was applied")
    speculate: int = Field(..., description="N the profile recommends (applied)")
    speculate_max_batch: int | None = Field(..., description="gate the profile recommends")
    stale: bool = Field(
        ..., description="the loaded artifacts differ from those the profile was measured on"
    )
    problems: list[str] = Field(..., description="what differs; empty when not stale")


class FingerprintsInfo(BaseModel):
    target: dict[str, Any] | None = Field(
        ..., description="sha256 of the target's config.json and weights"
    )
    proposer: dict[str, Any] | None = Field(
        ..., description="proposer kind and its artifact's hashes; null when speculation is off"
    )


class WindowPoolInfo(BaseModel):
    """The sliding-window layers' KV pool (Gemma 3's five layers in six): each sequence holds
    only its window there."""

    window: int = Field(description="positions a sliding layer attends to")
    layers: int = Field(description="sliding layers; the other layers' K/V are in kv_blocks")
    blocks: int
    bytes: int
    blocks_used: int
    blocks_peak: int = Field(description="the most blocks sequences held at once so far")
    blocks_attached: int = Field(description="blocks kept with cached prefixes")


class MemoryInfo(BaseModel):
    weights_bytes: int
    kv_cache_bytes: int
    kv_cache_dtype: str = Field(
        description="element type of the KV cache: float16 where the CPU attention kernel reads "
        "it (--kv-cache-dtype, the default), float32 when asked; else the model's dtype",
    )
    kv_cache_tokens: int
    kv_block_size: int
    kv_blocks: int
    prefix_caching: bool = Field(
        description="full blocks of computed tokens are reused by later prompts that start the "
        "same way (--no-prefix-caching turns it off)"
    )
    kv_blocks_cached: int = Field(description="blocks holding reusable prefix content now")
    kv_window_pool: WindowPoolInfo | None = Field(
        default=None,
        description="a model with sliding-window layers beside full ones: those layers' own "
        "pool (kv_cache_bytes counts both; kv_cache_tokens is the full layers' capacity); "
        "--no-window-kv-pool keeps every layer in one",
    )
    budget: dict[str, int] | None = Field(
        default=None,
        description="the engine's memory plan (with --max-memory): weights, "
        "activation peak, KV and headroom, in bytes",
    )
    available_bytes: int | None = Field(
        default=None, description="device (or host) memory still free now, where measurable"
    )


class ModelWeightsInfo(BaseModel):
    bytes_by_type: dict[str, int]
    block_tensors: int
    float32_tensors: int
    expanded_types: dict[str, int] = Field(description="GGUF type -> tensors run as float32")


class Info(BaseModel):
    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_weight_blocks: list[str] = Field(
        default_factory=list,
        description="GGUF block formats the weights run as (float32 compute); empty: plain "
        "model_dtype weights",
    )
    model_numerics: Literal["q8", "exact"] | None = Field(
        default=None,
        description="arithmetic of the block weights (--numerics): q8, activations quantised "
        "to int8 per 32 values and integer dot products (llama.cpp's numerics); exact, float32 "
        "products (HF transformers' numbers up to summation order); null: no block weights",
    )
    model_q8_kernels: Literal["vnni", "avx2", "scalar"] | None = Field(
        default=None,
        description="the q8 numerics' kernels on this CPU, picked at start-up: vnni "
        "(AVX512-VNNI integer dot products on the interleaved weight rows, AVX2 for the rest), "
        "avx2, or scalar (the reference); each gives the same numbers, bit for bit. null "
        "unless model_numerics is q8",
    )
    model_block_kernel_fallback: str | None = Field(
        default=None,
        description="why the model's GGUF blocks are not used (the block kernels failed their "
        "start-up product check against the float32 weights); null when they are, or none exist",
    )
    model_native_refusal: str | None = Field(
        default=None,
        description="why the decoder's layers do not run in one native call per step (what the "
        "native decoder does not implement, or weights that are not all blocks); null when they do",
    )
    model_weights: ModelWeightsInfo | None = Field(
        default=None,
        description="a GGUF's tensors: bytes per GGUF type in the file, how many run as block "
        "rows and as float32, and the quantised types expanded to float32 for lack of a kernel "
        "here (slower, 4-8x their memory); null for a checkpoint",
    )
    attention: Literal["ragged", "reference"] = Field(
        description="ragged: decode/verify rows read the paged KV cache in place (CPU kernel), "
        "prefill chunks run per sequence; reference: every sequence padded to the step's longest"
    )
    model_device_type: str
    model_pipeline_tag: str = "text-generation"
    max_concurrent_requests: int
    max_running_requests: int = Field(..., description="sequences decoding at once")
    max_best_of: int = 1
    max_stop_sequences: int
    max_input_tokens: int
    max_total_tokens: int
    max_batch_total_tokens: int = Field(..., description="KV cache capacity in tokens")
    max_batch_prefill_tokens: int = Field(..., description="tokens scored in one forward pass")
    max_client_batch_size: int = 1
    router: str = "specserve"
    version: str
    sha: str | None = None
    docker_label: str | None = None
    speculation: SpeculationInfo
    speculation_profile: ProfileInfo | None = Field(
        default=None, description="the --speculation-profile applied at start-up"
    )
    fingerprints: FingerprintsInfo | None = Field(
        default=None, description="what a speculation profile is checked against"
    )
    memory: MemoryInfo
