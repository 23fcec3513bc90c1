"""OpenAI request shapes for /v1/completions and /v1/chat/completions (the replies'
shapes: openai_replies.py).

Every field of OpenAI's two request schemas is defined: honoured, or accepted and ignored where
it means nothing here (server/openai_fields.py), or, where this server cannot give what it asks
for, accepted only at its neutral value (a clear 400 otherwise). A field nobody defines is
ignored, logged and counted (as vLLM). Extensions: vLLM's `top_k`, `min_p`,
`repetition_penalty`, `ignore_eos`, `cache_salt`, and our `speculate`, `speculation_policy`;
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, field_validator

from specserve.request import MAX_LOGIT_BIAS, MAX_PENALTY
from specserve.server.openai_fields import BothEndpoints, ChatOnly
from specserve.server.schemas import (
    MAX_REPETITION_PENALTY,
    U64_MAX,
    Lenient,
    UnicodeChecked,
    accepts,
    cache_salt_field,
    check_stops,
    check_top_logprobs,
    speculation_policy_field,
)


class StreamOptions(Lenient):
    include_usage: bool = False
    include_obfuscation: bool | None = Field(default=None, description="accepted and ignored")


Bias = Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]


class SamplingFields(BothEndpoints):
    """Fields shared by completions and chat completions."""

    model: str | None = Field(
        default=None,
        description="the served model's id (see /v1/models) or its short name; a fleet also "
        "routes by it",
    )
    temperature: float | None = Field(default=None, ge=0, le=2, description="0 = greedy; default 1")
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(
        default=1, ge=1, description="choices to generate, up to the server's --max-choices"
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Annotated[str | list[str] | None, AfterValidator(check_stops)] = Field(
        default=None, description="up to 4 stop sequences"
    )
    seed: int | None = Field(default=None, ge=0, le=U64_MAX)
    presence_penalty: float | None = Field(
        default=None,
        ge=-MAX_PENALTY,
        le=MAX_PENALTY,
        description="-2..2: subtracted from the logit of every token generated so far",
    )
    frequency_penalty: float | None = Field(
        default=None,
        ge=-MAX_PENALTY,
        le=MAX_PENALTY,
        description="-2..2: subtracted from a token's logit once per time it was generated",
    )
    logit_bias: dict[str, Bias] | None = Field(
        default=None,
        description='{"<token id>": -100..100} added to those tokens\' logits (-100: never '
        "picked in practice, 100: nearly always)",
    )
    # Extensions.
    top_k: int | None = Field(default=None, ge=-1, description="extension: 0 or -1 = off")
    min_p: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="extension (vLLM's): when sampling, drop tokens less likely than min_p "
        "times the most likely one",
    )
    repetition_penalty: float | None = Field(
        default=None, gt=0, le=MAX_REPETITION_PENALTY, description="extension; at most 100"
    )
    speculate: int | None = Field(
        default=None, ge=0, description="extension: max drafted tokens per step, 0..server N"
    )
    speculation_policy: Literal["static"] | None = speculation_policy_field()
    ignore_eos: bool = Field(default=False, description="extension: keep generating past EOS")
    cache_salt: str | None = cache_salt_field()

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys must be token ids (decimal integers); got {key[:32]!r}")
        if len({int(key) for key in value or {}}) < len(value or {}):
            raise ValueError("names a token id twice (e.g. as '7' and '07')")
        return value


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        ..., description="one prompt: text or token ids"
    )
    max_tokens: int | None = Field(default=16, ge=1)
    echo: Annotated[bool, accepts((False,), "must be false")] = Field(
        default=False, description="not supported; must be false"
    )
    logprobs: Annotated[int | None, AfterValidator(check_top_logprobs)] = Field(
        default=None,
        ge=0,
        description="log-probabilities of the chosen tokens and of this many most likely ones "
        "(at most 20)",
    )
    best_of: int | None = Field(default=None, ge=1, description="only 1 (or n) is supported")
    suffix: Annotated[str | None, accepts((None, ""), "must be null")] = Field(
        default=None, description="not supported; must be null"
    )

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and value and not isinstance(value[0], int) and len(value) != 1:
            raise ValueError(f"only one prompt per request is supported; got {len(value)}")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value not in (None, 1, info.data.get("n", 1)):
            raise ValueError("not supported by this server (only n)")
        return value


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(UnicodeChecked):
    # Lenient about extra fields on purpose: clients send back assistant messages with extra
    # null fields. Strict about types, as every request model.
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = Field(
        default=None, description="an assistant's earlier calls (sent back in the history)"
    )
    tool_call_id: str | None = Field(
        default=None, description="a tool message: the call it answers"
    )


class ChatCompletionRequest(SamplingFields, ChatOnly):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, description="default: the context left")
    max_completion_tokens: int | None = Field(default=None, ge=1, description="alias of max_tokens")
    logprobs: bool | None = Field(
        default=None, description="return the log-probability of each output token"
    )
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        description="and of this many most likely tokens at each position (0-20; needs logprobs)",
    )
    response_format: dict[str, Any] | None = Field(
        default=None,
        description='{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
        '"json_schema": {"name": ..., "schema": {...}}}',
    )
    tools: list[dict[str, Any]] | None = Field(
        default=None, description='functions the model may call: {"type": "function", ...}'
    )
    tool_choice: str | dict[str, Any] | None = Field(
        default=None,
        description='"none", "auto" (the default with tools), "required" or '
        '{"type": "function", "function": {"name": ...}}',
    )
    parallel_tool_calls: bool | None = None

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_budget(cls, value: int | None, info: ValidationInfo) -> int | None:
        asked = info.data.get("max_tokens")
        if value is not None and asked is not None and value != asked:
            raise ValueError(f"conflicts with max_tokens ({value} != {asked}): send one of them")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return check_top_logprobs(value)
