"""OpenAI function calling: the tools as a prompt and a grammar, the reply's calls parsed back.

Where the model's chat template takes `tools` and speaks a syntax of server/tool_formats.py
(Hermes/Qwen `<tool_call>`, Llama 3 JSON, Mistral `[TOOL_CALLS]`), the tools go to the template
and the model answers in its own syntax. Otherwise (the embedded SmolLM2) the model is shown the
tools in a system message of our own (their names, descriptions and parameter schemas) and told
to answer a call as one JSON object `{"name": ..., "arguments": {...}}`. Either way a Lark
grammar then holds the reply to that syntax:

- `tool_choice` "required" or a named function: the reply is calls, each `name` one of the tools
  (or the named one) and its arguments valid under that tool's parameter schema;
- "auto" (the default with tools): either such calls or text whose first character is not
  theirs (`<`, `{` or `[`), so a reply is calls exactly when it starts as calls;
- "none": no tools in the prompt, no constraint.

Several calls in one reply where `parallel_tool_calls` is true (the default) and the syntax has
a way to say them (ours has not: one call). A tool's parameters admit only the keys it declares
unless it says `additionalProperties` itself (OpenAI's strict mode), so a call ends when its
object closes. The JSON comes with the fixed separators of every grammar here, so the text
between the values is forced and drafted for free. A reply that is calls becomes
`message.tool_calls` with finish_reason "tool_calls".
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from specserve.grammar_limits import check_json_depth, check_value_depth
from specserve.request import GrammarSpec
from specserve.server.errors import invalid
from specserve.server.tool_formats import OWN, ToolSyntax, calls_grammar, parse

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

    def as_openai(self) -> dict[str, Any]:
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolPlan:
    """What a request's `tools` and `tool_choice` ask of the prompt, the grammar and the reply."""

    tools: tuple[Tool, ...] = ()  # shown to the model (empty: none)
    grammar: GrammarSpec | None = None
    forced: bool = False  # the reply is always calls ("required" or a named function)
    syntax: ToolSyntax = OWN  # how the model writes calls
    in_template: bool = False  # the tools go to the chat template (else our system message)

    @property
    def calls(self) -> bool:
        return self.grammar is not None

    def system_message(self) -> dict[str, str] | None:
        if not self.tools or self.in_template:
            return None
        listing = [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in self.tools
        ]
        return {"role": "system", "content": INSTRUCTIONS + json.dumps(listing)}

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them (None: not the template's to show)."""
        return [t.as_openai() for t in self.tools] if self.in_template and self.tools else None


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


def tool_plan(
    tools: list[dict[str, Any]] | None,
    choice: str | dict[str, Any] | None,
    syntax: ToolSyntax | None = None,
    parallel: bool | None = None,
    think: str = "",
    reply: dict[str, Any] | None = None,
) -> ToolPlan:
    """`syntax`: the chat template's (None: ours, tools in a system message). `parallel`:
    `parallel_tool_calls` (None: true). `think`: "block", a reasoning block may come first;
    "inside", the reply starts in one (the prompt opened it). `reply`: the response_format's
    schema, which a reply that is not calls follows (tool_choice "auto")."""
    parsed = parse_tools(tools)
    if choice is None:
        choice = "auto" if parsed else "none"
    if choice == "none":
        return ToolPlan()
    if not parsed:
        raise invalid("tool_choice", "needs tools")
    chosen, forced = list(parsed), choice != "auto"
    if isinstance(choice, dict):
        fn = choice.get("function")
        wanted = (
            fn.get("name") if choice.get("type") == "function" and isinstance(fn, dict) else None
        )
        chosen = [t for t in parsed if t.name == wanted]
        if not chosen:
            names = ", ".join(t.name for t in parsed)
            raise invalid("tool_choice", f"names no function of tools ({names}); got {wanted!r}")
    elif choice not in ("auto", "required"):
        raise invalid(
            "tool_choice", f'must be "none", "auto", "required" or a function; got {choice!r}'
        )
    own = syntax or OWN
    schemas = [_call_schema(t, own.args_key) for t in chosen]
    lark = calls_grammar(own, schemas, forced, parallel is not False, think, reply)
    return ToolPlan(parsed, GrammarSpec("lark", lark), forced, own, syntax is not None)


def strict(parameters: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's strict mode: an object admits only its declared keys unless it says otherwise."""
    if "additionalProperties" in parameters or parameters.get("type", "object") != "object":
        return parameters
    return {**parameters, "additionalProperties": False}


def _call_schema(tool: Tool, args_key: str) -> dict[str, Any]:
    # `name` comes before the arguments, and the arguments in the tool's own order.
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, args_key: strict(tool.parameters)},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def parse_calls(text: str, plan: ToolPlan) -> list[dict[str, Any]] | None:
    """The reply as OpenAI tool calls, if it is calls (else None: a text reply)."""
    found = parse(text, plan.syntax) if plan.calls else None
    if found is None:
        return None
    return [openai_call(c.name, c.arguments) for c in found]


def as_call(text: str, plan: ToolPlan) -> dict[str, Any] | None:
    """The reply's first call (see `parse_calls` for all of them), or None: a text reply."""
    calls = parse_calls(text, plan)
    return calls[0] if calls else None


def openai_call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def history_calls(calls: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """An assistant message's earlier `tool_calls` checked, their arguments parsed: as a chat
    template takes them (`function.arguments` a mapping)."""
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
        function = {"name": fn["name"], "arguments": arguments}
        out.append({"id": call.get("id"), "type": "function", "function": function})
    return out


def calls_text(calls: list[dict[str, Any]], field: str) -> str:
    """An assistant message's earlier `tool_calls` as the text the model wrote for them (our
    own format)."""
    out = []
    for call in history_calls(calls, field):
        call_json = {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        out.append(json.dumps(call_json, separators=(", ", ": ")))
    return "\n".join(out)
