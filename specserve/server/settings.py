"""Server-level settings and the limits every request is checked against."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.engine.engine import Engine


@dataclass(frozen=True)
class ServerSettings:
    # Name served in /info and /v1/models (the --model value, or the embedded default's name).
    model_id: str
    # Longest prompt in tokens; None = the context window minus one.
    max_input_tokens: int | None = None
    # Generation requests in flight (running + queued) before new ones get 429.
    max_concurrent_requests: int = 128
    # Bearer token required on every route except /health and /metrics; None = open.
    api_key: str | None = None
    # Largest request body accepted; larger ones get 413.
    max_body_bytes: int = 2_000_000
    max_stop_sequences: int = 4
    # Seconds a client is told to wait (Retry-After) when the server is saturated.
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if self.max_input_tokens is not None and self.max_input_tokens < 1:
            raise ValueError(f"max_input_tokens must be >= 1, got {self.max_input_tokens}")
        if self.max_concurrent_requests < 1:
            raise ValueError(
                f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}"
            )
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.api_key == "":
            raise ValueError("api_key must be non-empty when given")


@dataclass(frozen=True)
class Limits:
    """What a request may ask for, resolved once from the engine and the settings."""

    max_input_tokens: int
    max_total_tokens: int  # context window: prompt + generated
    kv_capacity_tokens: int  # KV slots in the whole pool: one request can never exceed it
    speculate: int  # the server's N
    max_stop_sequences: int
    vocab_size: int

    @classmethod
    def from_engine(cls, engine: Engine, settings: ServerSettings) -> Limits:
        total = engine.max_model_len
        max_input = min(settings.max_input_tokens or total - 1, total - 1)
        alloc = engine.res.allocator
        return cls(
            max_input_tokens=max_input,
            max_total_tokens=total,
            kv_capacity_tokens=alloc.num_blocks * alloc.block_size,
            speculate=engine.config.spec.speculate,
            max_stop_sequences=settings.max_stop_sequences,
            vocab_size=engine.res.model.arch.vocab_size,
        )
