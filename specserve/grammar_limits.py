"""What a grammar may ask for, checked before llguidance sees it: a regex's size once its
counted repeats are unrolled (also every `pattern` of a JSON schema, and the schemas a Lark
grammar embeds with `%json`), and how deep the JSON a client sends nests (a schema, a tool
call's arguments), measured without parsing or recursing. Each check raises ValueError
naming what it refused (a 4xx)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

# What neither bounds: a regex's counted repeats multiply out in its automaton, and the limits
# above let (x{1000}){1000} through at ~30 ms a mask (a decode step is ~7 ms). A regex (or a JSON
# schema's `pattern`) that unrolls to more positions than this is refused before compiling;
# (x{100}){100}, at the limit, costs ~4 ms a mask. Then, at compile time, a grammar whose mask
# still takes over SLOW_MASK_S of CPU is refused too.
MAX_REGEX_POSITIONS = 10_000
_COUNTER = re.compile(r"\{(\d*)(,(\d*))?\}")
_BRACES = re.compile(r"\{[^}]*\}")
_GROUP_FLAGS = re.compile(r"[^:>)]*[:>]?")


def regex_positions(pattern: str) -> int:
    """How many positions `pattern` unrolls to with every counted repeat `{m}`, `{m,}`, `{m,n}`
    written out: a character, class or escape is one, a group the sum of its parts, a repeat
    its part times its largest count (`*`, `+` and `?` add nothing). An upper bound, enough to
    tell a regex built to explode from one that counts digits."""
    groups: list[list[int]] = [[]]  # the sizes of each open group's parts so far
    i = 0
    while i < len(pattern):
        c = pattern[i]
        counter = _COUNTER.match(pattern, i) if c == "{" else None
        if counter and groups[-1] and (counter.group(1) or counter.group(3)):
            groups[-1][-1] *= max(1, int(counter.group(3) or counter.group(1)))
            i = counter.end()
            continue
        if c == "(":
            groups.append([])
            if pattern[i + 1 : i + 2] == "?":  # (?:, (?P<name>: no positions of their own
                i = _GROUP_FLAGS.match(pattern, i + 2).end() - 1  # type: ignore[union-attr]
        elif c == ")" and len(groups) > 1:
            inner = sum(groups.pop())
            groups[-1].append(max(1, inner))
        elif c == "[":  # a class, to its closing bracket
            i += 2 if pattern[i + 1 : i + 2] == "^" else 1
            i += 1 if pattern[i : i + 1] == "]" else 0  # a "]" first is a literal
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            groups[-1].append(1)
        elif c == "\\":
            braces = _BRACES.match(pattern, i + 2) if pattern[i + 1 : i + 2] in "pPux" else None
            i = braces.end() - 1 if braces else i + 1  # \p{L}, \u{..}: one position
            groups[-1].append(1)
        elif c not in "*+?|^$":
            groups[-1].append(1)
        i += 1
    return sum(sum(parts) for parts in groups)


_JSON_RULE = re.compile(r"%json\s*")


def lark_schemas(text: str) -> list[object]:
    """The JSON schemas a Lark grammar embeds (`%json {...}`), as llguidance will read them. A
    `%json` not followed by valid JSON is left to llguidance to refuse."""
    decoder = json.JSONDecoder()
    found = []
    for match in _JSON_RULE.finditer(text):
        try:
            found.append(decoder.raw_decode(text, match.end())[0])
        except json.JSONDecodeError:
            continue
        except RecursionError as exc:
            raise ValueError(f"a %json schema is nested over {MAX_JSON_DEPTH} levels") from exc
        check_value_depth(found[-1], "a %json schema")
    return found


# The deepest JSON nesting accepted in what clients send to be parsed or walked (a schema, a
# tool call's arguments): far past any real schema, far below where Python's recursion (the
# json module, json.dumps, a recursive walk) overflows, near 1000 frames.
MAX_JSON_DEPTH = 100
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def json_depth(text: str, stop_past: int = MAX_JSON_DEPTH) -> int:
    """How deep `text`'s arrays and objects nest (brackets inside strings ignored), without
    parsing it; the count stops once past `stop_past`."""
    depth = deepest = 0
    for match in _JSON_TOKEN.finditer(text):
        c = match.group()
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_past:
                    break
        elif c in "]}":
            depth -= 1
    return deepest


def check_json_depth(text: str, what: str) -> None:
    """ValueError naming `what` if JSON text `text` nests deeper than MAX_JSON_DEPTH: checked
    before parsing it, which would overflow the stack (RecursionError) ~1000 levels down."""
    if json_depth(text) > MAX_JSON_DEPTH:
        raise ValueError(f"{what} is nested over {MAX_JSON_DEPTH} levels deep")


def value_depth(value: object, stop_past: int = MAX_JSON_DEPTH) -> int:
    """How deep a parsed JSON value's lists and dicts nest, walked without recursion; the walk
    stops once past `stop_past`."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > stop_past:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_value_depth(value: object, what: str) -> None:
    """ValueError naming `what` if a parsed value nests deeper than MAX_JSON_DEPTH (json.dumps
    and recursive walks of it would overflow the stack)."""
    if value_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"{what} is nested over {MAX_JSON_DEPTH} levels deep")


def check_regex(pattern: str) -> None:
    """ValueError if `pattern` unrolls to more than MAX_REGEX_POSITIONS."""
    positions = regex_positions(pattern)
    if positions > MAX_REGEX_POSITIONS:
        raise ValueError(
            f"the regex {pattern[:60]!r} unrolls to {positions} positions (its counted repeats "
            f"multiplied out); at most {MAX_REGEX_POSITIONS} are accepted"
        )


def schema_patterns(schema: object) -> list[str]:
    """The regexes of a JSON schema: every `pattern` and `patternProperties` key. Walked
    without recursion, so any depth the parser produced is safe."""
    found: list[str] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.append(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                found += list(node["patternProperties"])
            stack.extend(node.values())
    return found
