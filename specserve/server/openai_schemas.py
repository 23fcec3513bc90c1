"""OpenAI request and response shapes for /v1/completions, /v1/chat/completions and /v1/models.

Fields OpenAI defines but this server cannot honour are accepted only at their neutral value, so
that clients sending defaults work and clients asking for more get a clear 400. Extensions:
`top_k`, `repetition_penalty`, `speculate`, `speculation_policy`, `ignore_eos`; usage reports
speculation as `completion_tokens_details.accepted_prediction_tokens` /
`rejected_prediction_tokens`, plus the extension `speculation_steps`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specserve.server.schemas import (
    MAX_REPETITION_PENALTY,
    U64_MAX,
    Strict,
    UnicodeChecked,
    cache_salt_field,
    speculation_policy_field,
)

FinishReasonOpenAI = Literal["stop", "length", "tool_calls"]


class StreamOptions(Strict):
    include_usage: bool = False


class SamplingFields(Strict):
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
    stop: str | list[str] | None = Field(default=None, description="up to 4 stop sequences")
    seed: int | None = Field(default=None, ge=0, le=U64_MAX)
    presence_penalty: float | None = Field(
        default=None, ge=-2, le=2, description="only 0 is supported"
    )
    frequency_penalty: float | None = Field(
        default=None, ge=-2, le=2, description="only 0 is supported"
    )
    logit_bias: dict[str, float] | None = Field(default=None, description="only empty is supported")
    user: str | None = None
    # Extensions.
    top_k: int | None = Field(default=None, ge=0, description="extension: 0 = off")
    repetition_penalty: float | None = Field(
        default=None, gt=0, le=MAX_REPETITION_PENALTY, description="extension; at most 100"
    )
    speculate: int | None = Field(
        default=None, ge=0, description="extension: max drafted tokens per step, 0..server N"
    )
    speculation_policy: Literal["static"] | None = speculation_policy_field()
    ignore_eos: bool = Field(default=False, description="extension: keep generating past EOS")
    cache_salt: str | None = cache_salt_field()


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        ..., description="one prompt: text or token ids"
    )
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = Field(default=False, description="not supported; must be false")
    logprobs: int | None = Field(
        default=None,
        ge=0,
        description="log-probabilities of the chosen tokens and of this many most likely ones "
        "(at most 20)",
    )
    best_of: int | None = Field(default=None, ge=1, description="only 1 is supported")
    suffix: str | None = Field(default=None, description="not supported; must be null")


class TextPart(Strict):
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


class ChatCompletionRequest(SamplingFields):
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
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="extension (vLLM's): extra variables for the chat template, e.g. "
        '{"enable_thinking": false}',
    )


class CompletionTokensDetails(BaseModel):
    accepted_prediction_tokens: int = Field(..., description="speculated tokens accepted")
    rejected_prediction_tokens: int = Field(..., description="speculated tokens rejected")
    speculation_steps: int = Field(
        default=0, description="extension: steps in which this request verified drafts"
    )


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails


class CompletionLogprobs(BaseModel):
    """The legacy completions form: parallel lists, one entry per output token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReasonOpenAI | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = Field(
        default=None, description="a thinking model's <think> block (server/reasoning.py)"
    )
    tool_calls: list[dict[str, Any]] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobEntry] | None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReasonOpenAI


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReasonOpenAI | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specserve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
