"""Structured workloads: chat requests whose reply a grammar constrains, and the check that each
reply is what was asked for.

- ``extract-json``: a Lee news article (gensim's ``lee_background.cor``, as ``summarize`` reads
  it) and OpenAI ``response_format`` ``json_schema``: its headline, people, places,
  organisations, topic and a one-sentence summary. Names are copied from the article, keys and
  punctuation are forced by the schema: both kinds of draft get their chance.
- ``tool-calls``: one user turn that asks for one of four tools (weather, news search, calendar
  event, currency conversion), templated from the word lists below, with ``tool_choice``
  alternately ``"required"`` and ``"auto"``.

`check_reply` is what the bench applies to every reply of such an item: the text parses as JSON
and validates against the schema, or the tool call names an offered tool and its arguments
validate against that tool's parameters (under ``"auto"`` a plain text answer is allowed too).
A reply that fails, or is cut at the token limit, is a failed request, with the reason as its
error.
"""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema

from specserve.bench.workload_items import ChatMessage, WorkloadItem
from specserve.bench.workload_text import lee_articles

_NAMES = {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 40}}
ARTICLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "headline": {"type": "string", "maxLength": 60},
        "people": _NAMES,
        "places": _NAMES,
        "organisations": _NAMES,
        "topic": {
            "enum": ["politics", "business", "sport", "science", "crime", "disaster", "other"]
        },
        "summary": {"type": "string", "maxLength": 120},
    },
    "required": ["headline", "people", "places", "organisations", "topic", "summary"],
    "additionalProperties": False,
}


def build_extract_json(n: int, seed: int) -> list[WorkloadItem]:
    rng = random.Random(seed)
    articles = lee_articles()
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "article", "schema": ARTICLE_SCHEMA, "strict": True},
    }
    structured = json.dumps({"response_format": response_format}, sort_keys=True)
    ask = "Extract the article's headline, people, places, organisations, topic and summary."
    order = rng.sample(articles, len(articles))
    return [
        WorkloadItem(
            f"extract-json-{i:04d}:lee/{k}",
            "extract-json",
            messages=(ChatMessage("system", ask), ChatMessage("user", article)),
            structured=structured,
        )
        for i, (k, article) in enumerate(order[i % len(order)] for i in range(n))
    ]


def tool(
    name: str, description: str, properties: dict[str, Any], closed: bool = True
) -> dict[str, Any]:
    """An OpenAI function tool whose parameters are all required; `closed`: and no others."""
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    parameters["required"] = list(properties)
    if closed:
        parameters["additionalProperties"] = False
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


_TEXT = {"type": "string", "maxLength": 60}
TOOLS = [
    tool(
        "get_weather",
        "The current weather in a city.",
        {"city": _TEXT, "unit": {"enum": ["celsius", "fahrenheit"]}},
    ),
    tool(
        "search_news",
        "Search recent news articles.",
        {"query": _TEXT, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}},
    ),
    tool(
        "create_event",
        "Put an event in the user's calendar.",
        {"title": _TEXT, "date": _TEXT, "attendees": {**_NAMES, "items": _TEXT}},
    ),
    tool(
        "convert_currency",
        "Convert an amount between currencies.",
        {"amount": {"type": "number"}, "from": _TEXT, "to": _TEXT},
    ),
]
_CITIES = ("Lisbon", "Nairobi", "Osaka", "Winnipeg", "Valparaiso", "Tromso", "Adelaide", "Quito")
_TOPICS = ("tidal energy", "chess openings", "urban beekeeping", "cocoa prices", "rail strikes")
_PEOPLE = ("Amara", "Bjorn", "Chidi", "Dolores", "Emeka", "Farah", "Goran", "Hiroko")
_ASKS = (
    lambda r: (
        f"Is it cold in {r.choice(_CITIES)} right now? Answer in "
        f"{r.choice(('celsius', 'fahrenheit'))}."
    ),
    lambda r: f"Find me the {r.randint(2, 9)} latest news stories about {r.choice(_TOPICS)}.",
    lambda r: (
        f"Book '{r.choice(_TOPICS).capitalize()} review' on {r.randint(1, 28)} May with "
        f"{' and '.join(r.sample(_PEOPLE, 2))}."
    ),
    lambda r: (
        f"How much is {r.randint(5, 900)} {r.choice(('EUR', 'USD', 'JPY'))} in "
        f"{r.choice(('GBP', 'CHF', 'KES'))}?"
    ),
)


def build_tool_calls(n: int, seed: int) -> list[WorkloadItem]:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        ask = _ASKS[i % len(_ASKS)](rng)
        choice = "required" if i % 2 == 0 else "auto"
        structured = json.dumps({"tools": TOOLS, "tool_choice": choice}, sort_keys=True)
        messages = (ChatMessage("user", ask),)
        items.append(WorkloadItem(f"tool-calls-{i:04d}", "tool-calls", messages=messages,
                                  structured=structured))  # fmt: skip
    return items


def check_reply(
    item: WorkloadItem, text: str, calls: list[dict[str, Any]], finish_reason: str | None
) -> str | None:
    """Why the reply is not what `item` asked for (None: it is). A structure cut at the token
    limit is not (raise the bench's --max-new-tokens); a text answer under tool_choice "auto"
    is, cut or not, like any chat reply."""
    fields = item.request_fields()
    choice = fields.get("tool_choice", "auto")
    text_answer = choice == "none" or (choice == "auto" and not text.startswith("{"))
    if "tools" in fields and not calls and text_answer:
        return None
    if finish_reason == "length":
        return "cut at the token limit before the grammar's end (raise --max-new-tokens)"
    if "tools" in fields:
        if not calls:
            return "no tool call"
        tools = {t["function"]["name"]: t["function"] for t in fields["tools"]}
        for call in calls:
            function = call.get("function") or {}
            tool = tools.get(function.get("name"))
            if tool is None:
                return f"a call to {function.get('name')!r}, not an offered tool"
            problem = _invalid(function.get("arguments", ""), tool.get("parameters") or {})
            if problem:
                return f"{tool['name']}'s arguments: {problem}"
        return None
    response_format = fields.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        return _invalid(text, response_format["json_schema"].get("schema") or {})
    if response_format.get("type") == "json_object":
        return _invalid(text, {"type": "object"})
    return None


def _invalid(text: str, schema: dict[str, Any]) -> str | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc})"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return f"does not validate: {exc.message}"
    return None
