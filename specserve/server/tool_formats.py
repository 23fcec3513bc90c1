"""Tool calls in a model's own syntax: which syntax a chat template speaks, the grammar that holds
a reply to it, and the reply's text read back as calls (whole, or as far as it has come).

A syntax is a call's JSON object (`{"name": ..., <args key>: {...}}`, name first) with fixed text
around it. `SYNTAXES`, the first whose marker the template holds wins:

- hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  several one per line;
- llama3_json (Llama 3.1-3.3): `{"name": ..., "parameters": {...}}`, several joined by `; `;
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`. `[TOOL_CALLS]` is a special
  token, which the detokenizer drops: a reply that starts with the list is read as calls too.

`OWN` is this server's format for templates without tools (the tools listed in a system message):
one `{"name": ..., "arguments": {...}}`. A reply is calls when it starts, after whitespace, with
its syntax's calls (the grammar of tool_choice "auto" lets text start with any character but
the calls' first: `<`, `{` or `[`).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from specserve.grammar import JSON_OPTIONS
from specserve.grammar_limits import MAX_JSON_DEPTH


@dataclass(frozen=True)
class ToolSyntax:
    name: str
    markers: tuple[str, ...]  # any of these in a chat template: it speaks this syntax
    args_key: str  # "arguments" or "parameters"
    opener: str = ""  # before the first call
    before: str = ""  # before each call's object
    after: str = ""  # after each call's object
    separator: str = ""  # between two calls
    close: str = ""  # after the last call
    skipped: str = ""  # a special token the opener starts with, which decoded text may lack
    skipped_id: int | None = None  # its id, where the tokenizer has it as one special token
    parallel: bool = True  # can say several calls in one reply

    @property
    def start(self) -> str:
        """What a reply that is calls starts with."""
        return (self.opener + self.before).strip() or "{"


HERMES = ToolSyntax(
    "hermes", ("<tool_call>",), "arguments", before="<tool_call>\n", after="\n</tool_call>",
    separator="\n",
)  # fmt: skip
LLAMA3_JSON = ToolSyntax(
    "llama3_json", ('"parameters": dictionary of argument name',), "parameters", separator="; "
)
MISTRAL = ToolSyntax(
    "mistral", ("[TOOL_CALLS]",), "arguments", opener="[TOOL_CALLS][", separator=", ", close="]",
    skipped="[TOOL_CALLS]",
)  # fmt: skip
SYNTAXES = (HERMES, MISTRAL, LLAMA3_JSON)
OWN = ToolSyntax("specserve", (), "arguments", parallel=False)


def template_syntax(template: str | None) -> ToolSyntax | None:
    """The tool syntax of a chat template that takes `tools` (None: it does not, or speaks
    none of `SYNTAXES`; then the tools go in a system message of `OWN` format)."""
    if not template or "tools" not in template:
        return None
    return next((s for s in SYNTAXES if any(m in template for m in s.markers)), None)


# ------------------------------------------------------------------------------- grammar
THINK_FIRST = {"": "", "block": "(think SPACE?)? ", "inside": "think SPACE? "}


def calls_grammar(
    syntax: ToolSyntax,
    schemas: list[dict[str, Any]],
    forced: bool,
    parallel: bool,
    think: str = "",
    reply: dict[str, Any] | None = None,
) -> str:
    """A Lark grammar (llguidance's, `%json` for each call) of a reply that is calls under
    `syntax`, each call's object valid under one of `schemas` (a tool's `{"name": {"const":
    ...}, <args key>: parameters}`), several only if `parallel`. Not `forced`: or text that does
    not start as calls do, or, given a `reply` schema (the request's response_format), JSON
    valid under it. `think`: "block", a `<think>...</think>` block may come first; "inside", the
    reply starts inside one (the prompt opened it) and goes on past `</think>`."""
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    many = parallel and syntax.parallel
    q = _lark_string
    more = f"({q(syntax.separator)} call)*" if many else ""
    call = "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS})
    lines = [
        "start: " + THINK_FIRST[think] + "body",
        "body: calls" if forced else "body: calls | text",
        "calls: " + _seq(_opener(syntax), "call", more, q(syntax.close)),
        "call: " + _seq(q(syntax.before), call, q(syntax.after)),
    ]
    if not forced and reply is not None:
        lines.append("text: %json " + json.dumps({**reply, "x-guidance": JSON_OPTIONS}))
    elif not forced:
        first = re.escape(syntax.start[0]).replace("/", "\\/")
        lines.append(f"text: /[^{first}](.|\\n)*/")
    if think:
        opener = '"<think>" ' if think == "block" else ""
        lines += [f'think[lazy]: {opener}/(.|\\n)*/ "</think>"', "SPACE: /\\s+/"]
    return "\n".join(lines) + "\n"


def _opener(syntax: ToolSyntax) -> str:
    """The opener in Lark; a special token as the token itself (`<[id]>`), as the model writes
    it, not as its characters."""
    if syntax.skipped_id is None:
        return _lark_string(syntax.opener)
    rest = _lark_string(syntax.opener[len(syntax.skipped) :])
    return _seq(f"<[{syntax.skipped_id}]>", rest)


def _lark_string(text: str) -> str:
    return json.dumps(text) if text else ""


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)


# --------------------------------------------------------------------------------- parse
@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # the arguments' JSON as written (cut short while the call is unfinished)
    done: bool  # its object has closed and parsed


@dataclass(frozen=True)
class Scan:
    calls: list[ParsedCall]
    complete: bool  # the whole text is calls in the syntax, every one done


_HEAD = r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"%s"\s*:\s*'


def is_calls(text: str, syntax: ToolSyntax) -> bool | None:
    """Whether a reply that starts with `text` is calls (None: too short to tell)."""
    s = text.lstrip()
    starts = [syntax.start] + ([syntax.opener[len(syntax.skipped) :]] if syntax.skipped else [])
    if any(s.startswith(start) for start in starts):
        return True
    if any(start.startswith(s) for start in starts):
        return None
    return False


def scan(text: str, syntax: ToolSyntax, ends: dict[int, ObjectEnd] | None = None) -> Scan:
    """`text` read as calls in `syntax`, as far as it goes: each call whose name is known, with
    its arguments so far. `ends`: what earlier scans of a shorter prefix of the same text found
    (kept by a stream, filled here)."""
    ends = {} if ends is None else ends
    pos: int | None = _skip(text, 0)
    if syntax.skipped and not text.startswith(syntax.skipped, pos):  # dropped by the decoder
        pos = _expect(text, pos or 0, syntax.opener[len(syntax.skipped) :])
    else:
        pos = _expect(text, pos or 0, syntax.opener)
    head = _head(syntax.args_key)
    calls: list[ParsedCall] = []
    while pos is not None:
        pos = _expect(text, pos, syntax.before)
        m = head.match(text, _skip(text, pos)) if pos is not None else None
        if m is None:
            break
        name = _unquote(m.group(1))
        found = ends.setdefault(m.end(), ObjectEnd(m.end()))
        end = found.find(text)
        if end is None or name is None:
            calls.append(ParsedCall(name or m.group(1), text[m.end() :], False))
            break
        arguments = text[m.end() : end]
        closed = _expect(text, end, "}")
        if found.valid is None:
            found.valid = _is_object(arguments)
        if not found.valid or closed is None:
            calls.append(ParsedCall(name, arguments, False))
            break
        calls.append(ParsedCall(name, arguments, True))
        pos = _expect(text, closed, syntax.after)
        if pos is None:
            break
        rest = _skip(text, pos)
        if syntax.close and text.startswith(syntax.close, rest):
            done = _skip(text, rest + len(syntax.close)) == len(text)
            return Scan(calls, done)
        if rest == len(text) and not syntax.close:
            return Scan(calls, True)
        pos = _expect(text, pos, syntax.separator)
    return Scan(calls, False)


@functools.cache
def _head(args_key: str) -> re.Pattern[str]:
    return re.compile(_HEAD % args_key)


def parse(text: str, syntax: ToolSyntax) -> list[ParsedCall] | None:
    """The reply's calls if the whole of it is calls in `syntax`, else None (it is text)."""
    if not is_calls(text, syntax):
        return None
    found = scan(text, syntax)
    return found.calls if found.complete and found.calls else None


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _expect(text: str, pos: int, literal: str) -> int | None:
    """Past `literal` at `pos`, whitespace around it allowed (None: not there)."""
    literal = literal.strip()
    pos = _skip(text, pos)
    if not literal:
        return pos
    return pos + len(literal) if text.startswith(literal, pos) else None


def _unquote(raw: str) -> str | None:
    try:
        value = json.loads(f'"{raw}"')
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (json.JSONDecodeError, RecursionError):
        return False


class ObjectEnd:
    """Where the JSON object that starts at `start` closes, found as the text grows (a streamed
    reply is scanned again at each output: each character is looked at once, its arguments
    parsed once)."""

    def __init__(self, start: int) -> None:
        self.start = self.next = start
        self.depth, self.in_string, self.escaped = 0, False, False
        self.end: int | None = None
        self.broken = False  # not an object, or nested deeper than MAX_JSON_DEPTH
        self.valid: bool | None = None  # once closed: its text parses as a JSON object

    def find(self, text: str) -> int | None:
        """Past the object's closing brace in `text` (None: not closed, or broken)."""
        if self.end is not None or self.broken or len(text) <= self.start:
            return self.end
        if self.next == self.start and text[self.start] != "{":
            self.broken = True
            return None
        for i in range(self.next, len(text)):
            c = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
                self.broken = self.depth > MAX_JSON_DEPTH
                if self.broken:
                    return None
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = i + 1
                    return self.end
        self.next = len(text)
        return None
