"""Speculation's configuration record (`SpecConfig`, part of `EngineConfig`): who proposes,
under which policy, with which caps and artifacts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specserve.config_schema import flag

PolicyName = Literal["static", "adaptive"]
POLICIES: tuple[str, ...] = ("static", "adaptive")


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
    # a kind registered in speculation/registry.py (the flag's choices and help list them:
    # cli_args.py), or "auto"
    proposer: str = field(
        default="auto",
        metadata=flag(
            "--proposer",
            "PROPOSER",
            "who proposes drafts: auto (the draft model if --draft-model is given, else Medusa "
            "heads if the checkpoint has them or --medusa is given, else n-gram)",
            live=True,
        ),
    )
    # adaptive (the default, for every proposer): k per sequence from live acceptance, the
    # profiled step cost and what proposing costs, so that nothing is drafted where nothing
    # pays; static (opt-in): every sequence proposes its cap.
    policy: PolicyName = field(
        default="adaptive",
        metadata=flag(
            "--speculation-policy",
            "SPECULATION_POLICY",
            "adaptive (default): k per sequence and step from live acceptance, the step cost "
            "profiled at start-up and kept from live steps, and the proposer's own cost: drafts "
            "only what is expected to pay (turns speculation off under load); static: every "
            "sequence drafts its cap",
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
        if not self.proposer:
            raise ValueError("proposer must name a kind (or auto)")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}"
            )
        if self.suffix_cache_tokens < 1:
            raise ValueError(f"suffix_cache_tokens must be >= 1, got {self.suffix_cache_tokens}")
        if self.proposer == "draft" and self.draft_model is None:
            raise ValueError("proposer 'draft' needs draft_model (--draft-model PATH)")
