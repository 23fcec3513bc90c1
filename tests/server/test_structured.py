"""Structured outputs over HTTP against the embedded SmolLM2 (speculation on): OpenAI's
`response_format` through the unchanged openai SDK (json_schema, `parse()` with a pydantic model,
json_object, streamed), TGI's `grammar` through huggingface_hub, bad grammars refused with a 4xx
naming the problem, and the same tokens and logprobs with speculation on and off."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Literal

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient, TextGenerationInputGrammarType
from openai.types.chat import ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel, Field

from specserve.bench.loadgen import GenSettings, send
from specserve.bench.records import RequestRecord
from specserve.bench.structured_workloads import ARTICLE_SCHEMA
from specserve.bench.workloads import build_workload
from tests import http
from tests.server.conftest import Server, scrape

pytestmark = pytest.mark.integration

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Describe a pet cat in JSON: its name, age and colour."}
]


class Cat(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=30)
    colour: Literal["black", "white", "ginger", "grey"]


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "colour": {"enum": ["black", "white", "ginger", "grey"]},
    },
    "required": ["name", "age", "colour"],
    "additionalProperties": False,
}
FORMAT: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {"name": "cat", "schema": SCHEMA, "strict": True},
}
PHONE = r"\(0[0-9]{2}\) [0-9]{3}-[0-9]{4}"


@pytest.fixture(scope="module")
def client(smol_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)


def test_json_schema_reply_validates(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=80,
        temperature=0,
        response_format=FORMAT,
    )
    assert reply.choices[0].finish_reason == "stop"
    Cat.model_validate_json(reply.choices[0].message.content or "")
    # the keys in the schema's order, not sorted
    assert list(json.loads(reply.choices[0].message.content or "")) == ["name", "age", "colour"]


def test_parse_with_a_pydantic_model_and_json_object(client: openai.OpenAI) -> None:
    parsed = client.chat.completions.parse(
        model=MODEL,
        messages=ASK,
        max_tokens=80,
        temperature=0.7,
        seed=3,
        response_format=Cat,
    )
    assert isinstance(parsed.choices[0].message.parsed, Cat)
    anything = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if anything.choices[0].finish_reason == "stop":  # (an open object may run to max_tokens)
        assert isinstance(json.loads(anything.choices[0].message.content or ""), dict)
    assert (anything.choices[0].message.content or "").startswith("{")


def test_streamed_deltas_join_to_the_schema(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=80,
        temperature=0,
        response_format=FORMAT,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    Cat.model_validate_json(text)


def test_tgi_grammar_through_huggingface_hub(smol_server: Server) -> None:
    tgi = InferenceClient(smol_server.url)
    prompt = "Call us at (020) 555-0199 or at"
    regex = TextGenerationInputGrammarType(type="regex", value=PHONE)
    text = tgi.text_generation(prompt, max_new_tokens=20, grammar=regex)
    assert re.fullmatch(PHONE, text)
    schema = TextGenerationInputGrammarType(type="json", value=SCHEMA)
    as_json = tgi.text_generation("A cat in JSON:", max_new_tokens=80, grammar=schema)
    Cat.model_validate_json(as_json)


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        (
            "/generate",
            {"inputs": "hi", "parameters": {"grammar": {"type": "regex", "value": "(a"}}},
            "invalid regex",
        ),
        (
            "/generate",
            {"inputs": "hi", "parameters": {"grammar": {"type": "xml", "value": "<a/>"}}},
            "parameters.grammar.type",
        ),
        (  # built to explode: refused before it is compiled
            "/generate",
            {"inputs": "hi", "parameters": {"grammar": {"type": "regex", "value": "(x{999}){99}"}}},
            "unrolls to 98901 positions",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": ASK,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}},
                },
            },
            "Unimplemented keys",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": ASK,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strin"}},
                },
            },
            "invalid json schema",
        ),
        (
            "/v1/chat/completions",
            {"messages": ASK, "response_format": {"type": "json_object"}, "ignore_eos": True},
            "ignore_eos",
        ),
        (
            "/v1/chat/completions",
            {"messages": ASK, "response_format": {"type": "yaml"}},
            "response_format.type",
        ),
    ],
)
def test_bad_grammars_are_a_4xx_naming_the_problem(
    smol_server: Server, route: str, body: dict[str, object], message: str
) -> None:
    r = http.post(smol_server.url + route, json=body)
    assert r.status_code == (400 if route.startswith("/v1/") else 422), r.text
    assert message in r.text
    ok = http.post(smol_server.url + "/generate", json={"inputs": "hi"})
    assert ok.status_code == 200


def test_speculation_on_and_off_same_tokens_and_logprobs_under_a_grammar(
    smol_server: Server,
) -> None:
    prompt = 'Cat: {"name": "Tom", "age": 3, "colour": "grey"}\nCat: {"name": "Tom", "age":'
    replies = {}
    for speculate in (0, 4):
        params = {
            "max_new_tokens": 60,
            "details": True,
            "speculate": speculate,
            "grammar": {"type": "json", "value": SCHEMA},
            # every draft verified: the adaptive default may trim the rejected ones away
            "speculation_policy": "static",
        }
        r = http.post(smol_server.url + "/generate", json={"inputs": prompt, "parameters": params})
        assert r.status_code == 200, r.text
        replies[speculate] = r.json()
    off, on = replies[0]["details"], replies[4]["details"]
    assert [(t["id"], t["logprob"]) for t in on["tokens"]] == [
        (t["id"], t["logprob"]) for t in off["tokens"]
    ]
    assert off["drafted_tokens"] == 0
    assert on["drafted_tokens"] > on["accepted_tokens"] > 0  # drafted, kept some, rejected some
    Cat.model_validate_json(replies[4]["generated_text"])
    # the text the schema forces (`", "colour": "`) was among the drafts
    assert scrape(smol_server.url)["specserve_spec_forced_accepted_tokens_total"] > 0


def test_the_bench_sends_structured_items_and_checks_every_reply(smol_server: Server) -> None:
    items = build_workload("extract-json", 2, seed=0) + build_workload("tool-calls", 2, seed=0)

    async def run() -> list[RequestRecord]:
        async with httpx.AsyncClient(base_url=smol_server.url) as client:
            settings = GenSettings(max_new_tokens=256)
            t0 = time.perf_counter()
            return [await send(client, item, 4, settings, i, t0) for i, item in enumerate(items)]

    records = asyncio.run(run())
    assert [r.error for r in records] == [None] * 4
    assert all(r.ok and r.output_tokens > 0 for r in records)
    assert records[2].tool_calls and records[2].finish_reason == "tool_calls"  # required
    for record, item in zip(records[:2], items, strict=False):  # the replies the check passed
        assert set(json.loads(record.reply or "")) == set(ARTICLE_SCHEMA["required"]), item.id
