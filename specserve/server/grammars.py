"""The APIs' ways of asking for constrained output, as one `GrammarSpec` (specserve/grammar.py).

TGI: `parameters.grammar` = `{"type": "json", "value": <JSON schema>}` or `{"type": "regex",
"value": "<regex>"}` (and `{"type": "json_schema", "value": {"name": ..., "schema": ...}}`, TGI's
newer form). OpenAI chat: `response_format` = `{"type": "text"}` (none), `{"type":
"json_object"}` (any JSON object) or `{"type": "json_schema", "json_schema": {"name": ...,
"schema": {...}, "strict": true}}`. Only the shape is checked here; the engine compiles the
grammar (off the event loop) and refuses an invalid one with a 422 naming the problem.
"""

from __future__ import annotations

import json
from typing import Any

from specserve.grammar_limits import check_json_depth, check_value_depth
from specserve.request import GrammarSpec
from specserve.server.errors import invalid

ANY_OBJECT = {"type": "object"}


def schema_spec(schema: Any, field: str) -> GrammarSpec:
    """A JSON schema (an object, or its JSON text) as a spec. Its keys keep their order: the
    output's keys come in the order of `properties`, as the client's model declares them (the
    same schema sent twice, in the same order, compiles once)."""
    try:
        if isinstance(schema, str):
            check_json_depth(schema, "the schema")  # before parsing: json.loads would overflow
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise invalid(field, f"is not valid JSON: {exc}") from exc
        check_value_depth(schema, "the schema")  # before json.dumps and the schema's walks
    except ValueError as exc:
        raise invalid(field, str(exc)) from exc
    if not isinstance(schema, dict):
        raise invalid(field, f"must be a JSON schema object; got {type(schema).__name__}")
    return GrammarSpec("json_schema", json.dumps(schema))


def tgi_grammar(grammar: dict[str, Any] | None) -> GrammarSpec | None:
    if grammar is None:
        return None
    kind, value = grammar.get("type"), grammar.get("value")
    field = "parameters.grammar.value"
    if value is None:
        raise invalid(field, "is required")
    if kind == "json":
        return schema_spec(value, field)
    if kind == "json_schema":
        schema = value.get("schema") if isinstance(value, dict) else None
        return schema_spec(schema if schema is not None else ANY_OBJECT, field + ".schema")
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise invalid(field, "must be a non-empty regex string")
        return GrammarSpec("regex", value)
    raise invalid(
        "parameters.grammar.type", f'must be "json", "json_schema" or "regex"; got {kind!r}'
    )


def response_format(fmt: dict[str, Any] | None) -> GrammarSpec | None:
    kind = (fmt or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return schema_spec(ANY_OBJECT, "response_format")
    if kind == "json_schema":
        spec = (fmt or {}).get("json_schema")
        if not isinstance(spec, dict) or not spec.get("name"):
            raise invalid("response_format.json_schema", "needs an object with a `name`")
        schema = spec.get("schema")
        return schema_spec(
            ANY_OBJECT if schema is None else schema, "response_format.json_schema.schema"
        )
    raise invalid(
        "response_format.type", f'must be "text", "json_object" or "json_schema"; got {kind!r}'
    )
