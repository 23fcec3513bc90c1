"""OpenAI function calling: the tools as a prompt and a grammar, the reply's call parsed back.

The model is shown the tools in a system message (their names, descriptions and parameter
schemas) and told to answer a call as one JSON object `{"name": ..., "arguments": {...}}`. The
grammar then holds it to that:

- `tool_choice` "required" or a named function: the output is such an object, `name` one of the
  tools (or the named one) and `arguments` valid under that tool's parameter schema;
- "auto" (the default with tools): either such an object or text that does not start with `{`
  (a Lark grammar over llguidance's `%json`), so a reply is a call exactly when it starts with `{`;
- "none": no tools in the prompt, no constraint.

The call's JSON comes with the fixed separators of every grammar here, so the text between the
values (`", "arguments": {"`) is forced and drafted for free. A reply that is a call becomes
`message.tool_calls` with finish_reason "tool_calls"; streamed, it arrives whole in one delta
once generated (OpenAI's clients accumulate deltas, so one is as good as many).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from specserve.grammar import (
    JSON_OPTIONS,
    MAX_JSON_DEPTH,
    check_json_depth,
    check_value_depth,
    json_depth,
)
from specserve.request import GrammarSpec
from specserve.server.errors import invalid

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
INSTRUCTIONS = (
    "You can call these functions. To call one, reply with only a JSON object "
    '{"name": <function name>, "arguments": <its arguments>}; otherwise reply in text.\n'
)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    """What a request's `tools` and `tool_choice` ask of the prompt, the grammar and the reply."""

    tools: tuple[Tool, ...] = ()  # shown to the model (empty: none)
    grammar: GrammarSpec | None = None
    forced: bool = False  # the reply is always a call ("required" or a named function)

    @property
    def calls(self) -> bool:
        return self.grammar is not None

    def system_message(self) -> dict[str, str] | None:
        if not self.tools:
            return None
        listing = [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in self.tools
        ]
        return {"role": "system", "content": INSTRUCTIONS + json.dumps(listing)}


NO_TOOLS = ToolPlan()


def parse_tools(tools: list[dict[str, Any]] | None) -> tuple[Tool, ...]:
    out = []
    for i, t in enumerate(tools or []):
        field = f"tools[{i}]"
        fn = t.get("function")
        if t.get("type") != "function" or not isinstance(fn, dict):
            raise invalid(field, 'must be {"type": "function", "function": {...}}')
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise invalid(field + ".function.name", "must be 1-64 letters, digits, _ or -")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise invalid(field + ".function.parameters", "must be a JSON schema object")
        try:  # before json.dumps (the prompt, the grammar) and the schema's walks
            check_value_depth(params, "the schema")
        except ValueError as exc:
            raise invalid(field + ".function.parameters", str(exc)) from exc
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise invalid(field + ".function.description", "must be a string")
        out.append(Tool(name, description, params))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise invalid("tools", "function names must be unique")
    return tuple(out)


def tool_plan(tools: list[dict[str, Any]] | None, choice: str | dict[str, Any] | None) -> ToolPlan:
    parsed = parse_tools(tools)
    if choice is None:
        choice = "auto" if parsed else "none"
    if choice == "none":
        return ToolPlan()
    if not parsed:
        raise invalid("tool_choice", "needs tools")
    if isinstance(choice, dict):
        fn = choice.get("function")
        wanted = (
            fn.get("name") if choice.get("type") == "function" and isinstance(fn, dict) else None
        )
        chosen = [t for t in parsed if t.name == wanted]
        if not chosen:
            names = ", ".join(t.name for t in parsed)
            raise invalid("tool_choice", f"names no function of tools ({names}); got {wanted!r}")
        return ToolPlan(parsed, _call_grammar(chosen), forced=True)
    if choice == "required":
        return ToolPlan(parsed, _call_grammar(parsed), forced=True)
    if choice == "auto":
        text = r"/[^{](.|\n)*/"
        lark = f"start: call | text\ncall: %json {json.dumps(_call_schema(parsed))}\ntext: {text}\n"
        return ToolPlan(parsed, GrammarSpec("lark", lark))
    raise invalid(
        "tool_choice", f'must be "none", "auto", "required" or a function; got {choice!r}'
    )


def _call_schema(tools: list[Tool] | tuple[Tool, ...]) -> dict[str, Any]:
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": t.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**schema, "x-guidance": JSON_OPTIONS}


def _call_grammar(tools: list[Tool] | tuple[Tool, ...]) -> GrammarSpec:
    # Unsorted: `name` comes before `arguments`, and the arguments in the tool's own order.
    return GrammarSpec("json_schema", json.dumps(_call_schema(tools)))


def as_call(text: str, plan: ToolPlan) -> dict[str, Any] | None:
    """The reply as an OpenAI tool call, if it is one (else None: a text reply)."""
    if not plan.calls or not text.startswith("{") or json_depth(text) > MAX_JSON_DEPTH:
        return None  # too deep to parse safely: the reply stays text
    try:
        value = json.loads(text)
    except json.JSONDecodeError:  # cut short by max_tokens: not a call
        return None
    if not isinstance(value, dict) or "name" not in value or "arguments" not in value:
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": value["name"], "arguments": json.dumps(value["arguments"])},
    }


def calls_text(calls: list[dict[str, Any]], field: str) -> str:
    """An assistant message's earlier `tool_calls` as the text the model wrote for them."""
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(field, 'each must be {"type": "function", "function": {"name", ...}}')
        text = fn.get("arguments") or "{}"
        try:  # before parsing: json.loads would overflow the stack
            check_json_depth(text if isinstance(text, str) else "", "arguments")
        except ValueError as exc:
            raise invalid(field, str(exc)) from exc
        try:
            arguments = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise invalid(field, f"arguments must be a JSON string: {exc}") from exc
        call_json = {"name": fn["name"], "arguments": arguments}
        out.append(json.dumps(call_json, separators=(", ", ": ")))
    return "\n".join(out)
