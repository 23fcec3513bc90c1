"""Server-level settings and the limits every request is checked against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specserve.engine.engine import Engine


@dataclass(frozen=True)
class ServerSettings:
    # Name served in /info and /v1/models (the --model value, or the embedded default's name).
    model_id: str
    # Every name a request's `model` may use (--served-model-name); () = model_names(model_id).
    model_names: tuple[str, ...] = ()
    # Longest prompt in tokens; None = the context window minus one.
    max_input_tokens: int | None = None
    # Generation requests in flight (running + queued) before new ones get 429.
    max_concurrent_requests: int = 128
    # Bearer token required on every route except /health and /metrics; None = open.
    api_key: str | None = None
    # Several keys instead (--api-key-file, one a line): any one is accepted, and each is a
    # tenant: its requests share cached prompt blocks and suffix drafts only with each other.
    tenant_keys: tuple[str, ...] = ()
    # The operator's key (--admin-key-file): the only one /info and the cache resets take when
    # there are tenant keys (or when it is given at all); it is accepted on every route. None:
    # with one key (or none) whoever may call the server is its operator; with tenant keys
    # nobody is.
    admin_key: str | None = None
    # /metrics behind the key too (by default it is open to scrapers, as /health is).
    private_metrics: bool = False
    # Largest request body accepted; larger ones get 413.
    max_body_bytes: int = 2_000_000
    max_stop_sequences: int = 4
    # Most choices (OpenAI `n`) one request may ask for.
    max_choices: int = 8
    # Seconds a client is told to wait (Retry-After) when the server is saturated.
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if self.max_input_tokens is not None and self.max_input_tokens < 1:
            raise ValueError(f"max_input_tokens must be >= 1, got {self.max_input_tokens}")
        if self.max_concurrent_requests < 1:
            raise ValueError(
                f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}"
            )
        if self.max_choices < 1:
            raise ValueError(f"max_choices must be >= 1, got {self.max_choices}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.api_key == "" or "" in self.tenant_keys:
            raise ValueError("api_key must be non-empty when given")
        if self.api_key is not None and self.tenant_keys:
            raise ValueError("give api_key or tenant_keys, not both")
        if len(set(self.tenant_keys)) != len(self.tenant_keys):
            raise ValueError("tenant_keys must differ from each other")
        if self.admin_key == "":
            raise ValueError("admin_key must be non-empty when given")
        if self.admin_key is not None and self.admin_key in self.keys:
            raise ValueError("the admin key must differ from every API key")

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key a request may present; none: the server is open."""
        return (self.api_key,) if self.api_key is not None else self.tenant_keys


def model_names(model_id: str) -> tuple[str, ...]:
    """Names a request's `model` may use for the served model: its id and its last path part,
    without a .gguf suffix (`HuggingFaceTB/SmolLM2-135M-Instruct` -> `SmolLM2-135M-Instruct`,
    `/models/qwen.Q4_1.gguf` -> `qwen.Q4_1`). Requests are matched case-insensitively."""
    short = model_id.rstrip("/").rsplit("/", 1)[-1]
    names = [model_id, short, short.removesuffix(".gguf")]
    return tuple(dict.fromkeys(n for n in names if n))


def longest_token_chars(tokenizer: Any) -> int:
    """Most characters one token decodes to (its vocabulary string is at least as long: a
    byte-level token spells each byte as one character)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1)


MAX_TOP_LOGPROBS = 20  # OpenAI's cap on top_logprobs
# Longest stop string, in characters: every output token costs a scan of this many.
MAX_STOP_CHARS = 256


@dataclass(frozen=True)
class Limits:
    """What a request may ask for, resolved once from the engine and the settings."""

    max_input_tokens: int  # what is accepted: <= context window - 1 and <= KV pool - 1
    max_total_tokens: int  # context window: prompt + generated
    kv_capacity_tokens: int  # KV slots in the whole pool: one request can never exceed it
    speculate: int  # the server's N
    max_stop_sequences: int
    vocab_size: int
    model_names: tuple[str, ...] = ()  # names `model` may take (any case); () = any
    max_choices: int = 1  # OpenAI `n`
    max_input_reason: str = "--max-input-tokens"  # which bound sets max_input_tokens
    # Longest prompt text in characters (the context window x the longest token); None = any.
    max_prompt_chars: int | None = None

    @property
    def max_request_tokens(self) -> int:
        """Prompt + generated tokens one request may reach (context window and KV pool)."""
        return min(self.max_total_tokens, self.kv_capacity_tokens)

    @classmethod
    def from_engine(cls, engine: Engine, settings: ServerSettings) -> Limits:
        total = engine.max_model_len
        kv = engine.kv_pool().tokens
        # One token must be left to generate, within the window and within the pool.
        bounds = [(total - 1, "the context window minus one"), (kv - 1, "the KV cache minus one")]
        if settings.max_input_tokens is not None:
            bounds.insert(0, (settings.max_input_tokens, "--max-input-tokens"))
        max_input, why = min(bounds, key=lambda b: b[0])
        return cls(
            max_input_tokens=max_input,
            max_input_reason=why,
            max_total_tokens=total,
            kv_capacity_tokens=kv,
            speculate=engine.config.spec.speculate,
            max_stop_sequences=settings.max_stop_sequences,
            vocab_size=engine.facts.vocab_size,
            model_names=settings.model_names or model_names(settings.model_id),
            max_choices=settings.max_choices,
            max_prompt_chars=total * longest_token_chars(engine.tokenizer),
        )
