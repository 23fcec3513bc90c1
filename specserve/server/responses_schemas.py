"""OpenAI Responses API shapes for /v1/responses: the request, the response object and its output
items, as the openai SDK's `openai.types.responses` types read them.

The request is lenient, as clients expect: fields of OpenAI's schema that mean nothing here
(`metadata`, `user`, `service_tier`, `truncation`, `reasoning`, `include`, ...) are accepted and
ignored, and so is any other unknown field. The chat completions extensions (`seed`, `top_k`,
`repetition_penalty`, `stop`, `speculate`, `speculation_policy`, `ignore_eos`, `cache_salt`) pass
through to the chat request a Responses request becomes (server/responses_input.py), which checks
them. Usage reports speculation in `output_tokens_details` as the extensions
`accepted_prediction_tokens` / `rejected_prediction_tokens`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specserve.server.schemas import UnicodeChecked

Status = Literal["completed", "incomplete", "in_progress"]


class ResponsesRequest(UnicodeChecked):
    # extra="allow": unknown fields are ignored, except the chat extensions, read from the extras
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str | None = Field(default=None, description="the served model's id or short name")
    input: str | list[dict[str, Any]] = Field(
        ...,
        description="a user message's text, or items: messages ({role, content}, content a "
        'string or input_text parts), "function_call" and "function_call_output" items',
    )
    instructions: str | None = Field(
        default=None, description="a system message before the input (not carried over)"
    )
    previous_response_id: str | None = Field(
        default=None, description="continue a stored response's conversation (same API key)"
    )
    store: bool = Field(
        default=True,
        description="keep the response for previous_response_id and GET (bounded, in memory, "
        "per API key; the oldest go first)",
    )
    tools: list[dict[str, Any]] | None = Field(
        default=None,
        description='function tools: {"type": "function", "name", "description", "parameters"}',
    )
    tool_choice: str | dict[str, Any] | None = Field(
        default=None,
        description='"none", "auto" (the default with tools), "required" or '
        '{"type": "function", "name": ...}',
    )
    parallel_tool_calls: bool | None = Field(
        default=None, description="accepted; a reply carries at most one call"
    )
    text: dict[str, Any] | None = Field(
        default=None,
        description='{"format": {"type": "text"}}, {"format": {"type": "json_object"}} or '
        '{"format": {"type": "json_schema", "name": ..., "schema": {...}}}',
    )
    max_output_tokens: int | None = Field(
        default=None, ge=1, description="default: the context left"
    )
    temperature: float | None = Field(default=None, ge=0, le=2, description="0 = greedy; default 1")
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool = False
    metadata: dict[str, str] | None = Field(default=None, description="echoed back")
    background: bool | None = Field(default=None, description="only false is supported")


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Status
    content: list[OutputText]


class FunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str = Field(..., description="the arguments object as JSON text")
    status: Status


OutputItem = OutputMessage | FunctionCall


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0
    accepted_prediction_tokens: int = Field(
        default=0, description="extension: speculated tokens accepted"
    )
    rejected_prediction_tokens: int = Field(
        default=0, description="extension: speculated tokens rejected"
    )


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    truncation: Literal["disabled"] = "disabled"
    metadata: dict[str, str] = Field(default_factory=dict)
    usage: ResponseUsage | None = None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
