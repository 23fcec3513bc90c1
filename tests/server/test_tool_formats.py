"""Tool calls in a model's own syntax (server/tool_formats.py, server/tools.py): each syntax's
parser (complete, several calls, malformed -> text), partial scans for streaming, the grammar
admitting exactly the syntax, strict arguments, which template speaks which syntax."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specserve.grammar import Grammars
from specserve.models.tokenizer import load_tokenizer
from specserve.request import GrammarSpec
from specserve.server.chat_template import template_of
from specserve.server.tool_formats import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    OWN,
    ObjectEnd,
    ToolSyntax,
    parse,
    scan,
    template_syntax,
)
from specserve.server.tools import strict, tool_plan
from tests.server.chat_templates import HERMES_TOOLS, THINKING

ARGS = '{"a": "x\\"}", "b": [1, {"c": 2}]}'


def call(syntax: ToolSyntax, name: str, arguments: str) -> str:
    return f'{{"name": "{name}", "{syntax.args_key}": {arguments}}}'


def reply(syntax: ToolSyntax, *calls: str) -> str:
    """Calls as the model writes them in `syntax`."""
    inner = syntax.separator.join(syntax.before + c + syntax.after for c in calls)
    return syntax.opener + inner + syntax.close


def one(syntax: ToolSyntax) -> str:
    return reply(syntax, call(syntax, "f", ARGS))


def two(syntax: ToolSyntax) -> str:
    return reply(syntax, call(syntax, "f", ARGS), call(syntax, "g", "{}"))


@pytest.mark.parametrize("syntax", [HERMES, LLAMA3_JSON, MISTRAL, OWN], ids=lambda s: s.name)
def test_each_syntax_parses_a_call_and_refuses_a_broken_one(syntax: ToolSyntax) -> None:
    [call] = parse("  " + one(syntax) + "\n", syntax) or []
    assert call.name == "f" and json.loads(call.arguments) == {"a": 'x"}', "b": [1, {"c": 2}]}
    assert call.arguments == '{"a": "x\\"}", "b": [1, {"c": 2}]}'  # as the model wrote it
    text = one(syntax)
    for broken in (text[:-3], text + " and more", text.replace('"name"', '"nam"'), "Hello"):
        assert parse(broken, syntax) is None, broken
    assert parse(text.replace('"a": "x', '"a": x'), syntax) is None  # not JSON


@pytest.mark.parametrize("syntax", [HERMES, LLAMA3_JSON, MISTRAL], ids=lambda s: s.name)
def test_several_calls_in_one_reply(syntax: ToolSyntax) -> None:
    calls = parse(two(syntax), syntax)
    assert calls is not None and [(c.name, c.arguments) for c in calls] == [
        ("f", '{"a": "x\\"}", "b": [1, {"c": 2}]}'),
        ("g", "{}"),
    ]


def test_mistral_without_its_special_token_is_still_calls() -> None:
    """The detokenizer drops `[TOOL_CALLS]` (a special token): the bare list is the calls."""
    bare = two(MISTRAL).removeprefix("[TOOL_CALLS]")
    assert [c.name for c in parse(bare, MISTRAL) or []] == ["f", "g"]


def test_a_partial_reply_scans_to_a_prefix_of_each_call() -> None:
    """Streaming: every prefix of the text yields the calls named so far, each one's arguments
    a prefix of its final arguments, never the text after them."""
    text = two(HERMES)
    final = [(c.name, c.arguments) for c in parse(text, HERMES) or []]
    ends: dict[int, ObjectEnd] = {}  # kept from scan to scan, as a stream keeps it
    for n in range(len(text) + 1):
        found = scan(text[:n], HERMES)
        assert scan(text[:n], HERMES, ends) == found
        for partial, (name, arguments) in zip(found.calls, final, strict=False):
            assert partial.name == name and arguments.startswith(partial.arguments)
    assert scan(text, HERMES).complete


@pytest.fixture(scope="module")
def grammars(tiny_llama: Path) -> Grammars:
    tok = load_tokenizer(tiny_llama)
    return Grammars(tok, len(tok), frozenset({tok.convert_tokens_to_ids("<|im_end|>")}))


def admits(grammars: Grammars, spec: GrammarSpec | None, text: str) -> bool:
    assert spec is not None
    matcher = grammars.compile(spec).compiled.deep_copy()
    ids = grammars._hf.encode(text, add_special_tokens=False)
    return bool(matcher.consume_tokens(ids)) and matcher.is_accepting()


TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": n, "parameters": {"properties": {"a": {}}}}}
    for n in ("f", "g")
]


@pytest.mark.parametrize("syntax", [HERMES, LLAMA3_JSON, MISTRAL], ids=lambda s: s.name)
def test_the_grammar_admits_exactly_the_syntax(grammars: Grammars, syntax: ToolSyntax) -> None:
    def calls(*named: tuple[str, str]) -> str:
        return reply(syntax, *(call(syntax, name, arguments) for name, arguments in named))

    required = tool_plan(TOOLS, "required", syntax).grammar
    assert admits(grammars, required, calls(("f", '{"a": 1}')))
    assert admits(grammars, required, calls(("f", '{"a": 1}'), ("g", "{}")))
    assert not admits(grammars, required, calls(("f", '{"b": 1}')))  # undeclared key
    assert not admits(grammars, required, calls(("h", "{}")))  # no such tool
    assert not admits(grammars, required, calls(("f", '{"a":1}')))  # the separators
    assert not admits(grammars, required, "Sure.")
    single = tool_plan(TOOLS, "required", syntax, parallel=False).grammar
    assert admits(grammars, single, calls(("f", "{}")))
    assert not admits(grammars, single, calls(("f", "{}"), ("g", "{}")))
    named = tool_plan(TOOLS, {"type": "function", "function": {"name": "g"}}, syntax).grammar
    assert not admits(grammars, named, calls(("f", "{}")))
    auto = tool_plan(TOOLS, "auto", syntax).grammar
    assert admits(grammars, auto, calls(("g", "{}"))) and admits(grammars, auto, "Sure.")
    assert not admits(grammars, auto, syntax.start + " no call")


def test_a_thinking_model_may_think_before_its_calls(grammars: Grammars) -> None:
    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    block = tool_plan(TOOLS, "required", HERMES, think="block").grammar
    assert admits(grammars, block, call) and admits(grammars, block, f"<think>Hm.</think>\n{call}")
    inside = tool_plan(TOOLS, "required", HERMES, think="inside").grammar
    assert admits(grammars, inside, f"Hm.\n</think>\n\n{call}")
    assert not admits(grammars, inside, call)


def test_arguments_are_strict_unless_the_schema_says_otherwise() -> None:
    assert strict({"type": "object"}) == {"type": "object", "additionalProperties": False}
    assert strict({"properties": {}})["additionalProperties"] is False
    assert strict({"additionalProperties": True}) == {"additionalProperties": True}
    assert strict({"type": "array"}) == {"type": "array"}


def test_which_templates_take_tools_in_which_syntax() -> None:
    assert template_syntax(HERMES_TOOLS) is HERMES
    assert template_syntax(THINKING) is None  # no tools: our own format
    assert template_syntax("{{ tools }} [TOOL_CALLS] {{ messages }}") is MISTRAL
    llama = '{{ tools }} {"name": function name, "parameters": dictionary of argument name'
    assert template_syntax(llama) is LLAMA3_JSON
    assert template_syntax("{{ tools }} <|tool|>") is None  # a syntax we do not speak


def test_a_special_opener_is_written_as_its_token(tiny_llama: Path) -> None:
    """Mistral's `[TOOL_CALLS]` is one special token: the grammar has the model write that
    token (not its characters), and the reply, which the detokenizer decodes without it, is
    still calls."""
    tok = load_tokenizer(tiny_llama)
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    tok.chat_template = "{{ tools }}[TOOL_CALLS]{{ messages }}"
    token = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    template = template_of(tok, lambda text: tok.encode(text, add_special_tokens=False))
    assert template.tool_syntax is not None and template.tool_syntax.skipped_id == token
    grammars = Grammars(tok, len(tok), frozenset({tok.convert_tokens_to_ids("<|im_end|>")}))
    spec = tool_plan(TOOLS, "required", template.tool_syntax).grammar
    assert spec is not None
    calls = '[{"name": "f", "arguments": {}}]'
    matcher = grammars.compile(spec).compiled.deep_copy()
    assert matcher.consume_tokens([token, *tok.encode(calls, add_special_tokens=False)])
    assert matcher.is_accepting()
    as_text = [tok.encode(t, add_special_tokens=False) for t in ("[TOOL", "_CALLS]", calls)]
    refused = grammars.compile(spec).compiled.deep_copy()  # its characters, not the token
    assert not refused.consume_tokens([t for ids in as_text for t in ids])
    reply = tok.decode([token, *tok.encode(calls, add_special_tokens=False)], True)
    assert [c.name for c in parse(reply, template.tool_syntax) or []] == ["f"]


@pytest.mark.parametrize("syntax", [HERMES, LLAMA3_JSON, MISTRAL, OWN], ids=lambda s: s.name)
def test_auto_with_a_response_format_admits_calls_or_the_format(
    grammars: Grammars, syntax: ToolSyntax
) -> None:
    """OpenAI's tools with a response_format: the reply calls a tool or answers in the schema,
    never free text (an agent with tools and an output type asks this)."""
    pet = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    auto = tool_plan(TOOLS, "auto", syntax, reply=pet).grammar
    assert admits(grammars, auto, reply(syntax, call(syntax, "f", '{"a": 1}')))
    assert admits(grammars, auto, '{"name": "Tom"}')
    assert not admits(grammars, auto, "Sure.") and not admits(grammars, auto, '{"age": 3}')
    required = tool_plan(TOOLS, "required", syntax, reply=pet).grammar
    assert not admits(grammars, required, '{"name": "Tom"}')  # a call it must be
