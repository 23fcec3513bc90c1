"""A Responses request as the chat completions request it means, so that /v1/responses shares
the chat path's preparation (template, tools, grammar, sampling) instead of repeating it.

- `input`: a string is one user message; items are messages (`{role, content}`, content a
  string or text parts), "function_call" items (an assistant's earlier call; consecutive ones
  are one assistant message) and "function_call_output" items (a tool message); "reasoning"
  items are dropped. Anything else (images, files, item references) is a 400 naming it.
- `instructions`: a system message first; `previous_response_id`: the stored conversation
  (its inputs and outputs, not its instructions) before the new input, as OpenAI does.
- `tools` (flat: `{"type": "function", "name", ...}`), `tool_choice`, `text.format` and
  `max_output_tokens` become the chat fields; the chat path's errors are renamed to these fields.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from specserve.server.errors import ApiError, from_validation_errors, invalid
from specserve.server.openai_schemas import ChatCompletionRequest
from specserve.server.responses_schemas import ResponsesRequest

Message = dict[str, Any]  # a chat message as ChatCompletionRequest reads it
# The chat extensions a Responses request may carry (read from its extra fields).
EXTENSIONS = (
    "seed",
    "top_k",
    "repetition_penalty",
    "stop",
    "speculate",
    "speculation_policy",
    "ignore_eos",
    "cache_salt",
)
TEXT_TYPES = frozenset({"input_text", "output_text", "text", "refusal"})
ROLES = frozenset({"user", "assistant", "system", "developer"})
# chat field -> Responses field, for the chat path's error messages (first match wins)
_RENAMES = (
    (re.compile(r"^messages(\[\d+\])?(\.\w+)*"), "input"),
    (re.compile(r"^max_(completion_)?tokens"), "max_output_tokens"),
    (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"^(tools\[\d+\])\.function"), r"\1"),
)


def chat_request(req: ResponsesRequest, conversation: list[Message]) -> ChatCompletionRequest:
    """The chat request `req` means: its instructions, then `conversation` (a stored
    conversation's messages and `input_messages(req.input)`)."""
    first = [{"role": "system", "content": req.instructions}] if req.instructions else []
    fields: dict[str, Any] = {
        "model": req.model,
        "messages": [*first, *conversation],
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": req.stream,
        "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": response_format(req.text),
    }
    extra = req.model_extra or {}
    fields |= {k: extra[k] for k in EXTENSIONS if k in extra}
    if req.background:
        raise invalid("background", "only false is supported: responses are made while you wait")
    for name in ("conversation", "prompt"):
        if extra.get(name) is not None:
            raise invalid(name, "is not supported; send the input (or previous_response_id)")
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None}
        )
    except ValidationError as exc:
        raise renamed(from_validation_errors(exc.errors())) from None


def input_messages(items: str | list[dict[str, Any]]) -> list[Message]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[Message] = []
    for i, item in enumerate(items):
        field = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, field))
        elif kind == "function_call":
            call = _function_call(item, field)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", field)
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{field}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind != "reasoning":  # a model's reasoning summary: not ours to show the model
            raise invalid(
                f"{field}.type",
                'must be "message", "function_call" or "function_call_output" (or "reasoning", '
                f"which is dropped); got {kind!r}",
            )
    return out


def _message(item: dict[str, Any], field: str) -> Message:
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise invalid(f"{field}.role", f"must be one of {sorted(ROLES)}; got {role!r}")
    content = item.get("content")
    text = content if isinstance(content, str) else _text(content, f"{field}.content")
    return {"role": role, "content": text}


def _text(parts: Any, field: str) -> str:
    """Text parts joined with newlines, as the chat path joins a message's parts."""
    if not isinstance(parts, list):
        raise invalid(field, "must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in TEXT_TYPES:
            why = f"only text parts (input_text, output_text) are supported; got {kind!r}"
            raise invalid(f"{field}[{j}]", why)
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise invalid(f"{field}[{j}].text", "must be a string")
        texts.append(text)
    return "\n".join(texts)


def _function_call(item: dict[str, Any], field: str) -> dict[str, Any]:
    name, arguments = _string(item, "name", field), _string(item, "arguments", field)
    call_id = _string(item, "call_id", field)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _string(item: dict[str, Any], key: str, field: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise invalid(f"{field}.{key}", "must be a string")
    return value


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Flat Responses function tools in the chat form `{"type": "function", "function": {...}}`."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            got = tool.get("type")
            raise invalid(f"tools[{i}].type", f'only "function" tools are supported; got {got!r}')
        keys = ("name", "description", "parameters")
        out.append({"type": "function", "function": {k: tool[k] for k in keys if k in tool}})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function":
        raise invalid(
            "tool_choice",
            f'must be "none", "auto", "required" or {{"type": "function", "name": ...}}; '
            f"got type {choice.get('type')!r}",
        )
    return {"type": "function", "function": {"name": choice.get("name")}}


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as the chat `response_format`."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid("text.format", 'must be an object such as {"type": "text"}')
    if fmt.get("type") != "json_schema":
        return fmt
    keys = ("name", "schema", "strict", "description")
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in keys if k in fmt}}


def renamed(err: ApiError) -> ApiError:
    """`err` with the chat field it names spelled as the Responses field."""
    if err.param is None:
        return err
    for pattern, name in _RENAMES:
        new = pattern.sub(name, err.param, count=1)
        if new != err.param:
            message = err.message
            if message.startswith(err.param):
                message = new + message[len(err.param) :]
            err.param, err.message = new, message
            break
    return err


@contextlib.contextmanager
def responses_fields() -> Iterator[None]:
    """ApiErrors raised inside name the Responses fields rather than the chat ones."""
    try:
        yield
    except ApiError as err:
        raise renamed(err) from None
