"""One pass from a validated body to `Prepared` (#55 item 6): a tenant changes the cache salt
and nothing else. Tools were once lost for tenants, on a copy of the prepared request made for
them; each builder now makes its `SamplingParams` once, with the tenant in it."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest

from specserve.request import SamplingParams
from specserve.server.openai_schemas import ChatCompletionRequest, CompletionRequest
from specserve.server.params import Preparation, Prepared, prepare
from specserve.server.schemas import GenerateRequest
from tests.server.test_params import LIMITS as ONE_CHOICE
from tests.server.test_params import encode

# room for the tools' system message, and for n = 2
LIMITS = replace(
    ONE_CHOICE, max_choices=4, max_input_tokens=1000, max_total_tokens=2000, kv_capacity_tokens=2000
)

TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SAMPLING: dict[str, Any] = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "logit_bias": {"7": -100, "9": 2.5},
    "stop": ["\n\n", "END"],
    "seed": 1234,
    "n": 2,
    "speculate": 3,
    "speculation_policy": "static",
    "cache_salt": "mine",
    "user": "u-1",
}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
CHAT = {**SAMPLING, "messages": MESSAGES, "max_completion_tokens": 8, "logprobs": True}
BODIES = {
    "chat, tools": ChatCompletionRequest.model_validate(
        {**CHAT, "top_logprobs": 3, "tools": [TOOL], "tool_choice": "required"}
    ),
    "chat, response_format": ChatCompletionRequest.model_validate(
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "w"}}}
    ),
    "completion": CompletionRequest.model_validate(
        {**SAMPLING, "prompt": "hello", "max_tokens": 8, "logprobs": 2}
    ),
    "tgi": GenerateRequest.model_validate(
        {
            "inputs": "hello",
            "parameters": {
                "do_sample": True,
                "temperature": 0.7,
                "top_k": 5,
                "top_p": 0.9,
                "repetition_penalty": 1.1,
                "frequency_penalty": 0.5,
                "seed": 1234,
                "stop": ["END"],
                "max_new_tokens": 8,
                "top_n_tokens": 2,
                "decoder_input_details": True,
                "details": True,
                "grammar": {"type": "regex", "value": "[a-z]+"},
                "speculate": 3,
                "speculation_policy": "static",
                "cache_salt": "mine",
            },
        }
    ),
}
# SamplingParams fields a body above may leave at their defaults.
UNSET = {
    "chat, tools": {"ignore_eos", "prompt_logprobs"},
    "chat, response_format": {"ignore_eos", "prompt_logprobs"},
    "completion": {"ignore_eos", "prompt_logprobs", "grammar"},
    "tgi": {"ignore_eos", "presence_penalty", "logit_bias", "min_p"},
}


def encode_chat(messages: list[dict[str, Any]]) -> list[int]:
    return encode("".join(str(m["content"]) for m in messages))


def prepared(body: Any, tenant: str | None) -> Prepared:
    return prepare(body, Preparation(LIMITS, encode, encode_chat, tenant))


@pytest.mark.parametrize("name", list(BODIES))
def test_a_tenant_changes_the_salt_and_nothing_else(name: str) -> None:
    body = BODIES[name]
    alone = prepared(body, None)  # one API key (or none)
    default = SamplingParams()
    set_fields = {f.name for f in fields(SamplingParams)} - UNSET[name]
    unset = [n for n in set_fields if getattr(alone.params, n) == getattr(default, n)]
    assert not unset, f"the body asks for these, the prepared request lacks them: {unset}"
    if name == "chat, tools":
        assert alone.tools.calls and alone.tools.forced and alone.tools.tools
        assert alone.params.grammar == alone.tools.grammar
    for tenant in ("tenant-a", "tenant-b"):  # several API keys: each its own tenant
        theirs = prepared(body, tenant)
        assert theirs.params.cache_salt == f"{tenant}/mine"
        assert replace(theirs, params=replace(theirs.params, cache_salt="mine")) == alone


def test_a_tenant_without_a_salt_of_its_own() -> None:
    body = CompletionRequest.model_validate({"prompt": "hi", "seed": 1})
    assert prepared(body, None).params.cache_salt is None
    assert prepared(body, "tenant-a").params.cache_salt == "tenant-a"
