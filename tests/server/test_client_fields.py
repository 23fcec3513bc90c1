"""What clients send (#55): every field of OpenAI's Chat Completions and Completions requests
is known (the openai SDK's typed fields go through unchanged), vLLM's extensions too; a field
nobody defines is ignored with a warning line and a count, not refused; known fields keep
their ranges (400 naming the field); logit_bias, presence/frequency penalties and min_p are
honoured, and a token biased by -100 never appears."""

from __future__ import annotations

from collections import Counter
from typing import Any

import openai
import pytest

from tests import http
from tests.server.conftest import Server, scrape

COUNTER = 'specserve_request_ignored_fields_total{route="%s"}'
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def ignored(server: Server, route: str) -> float:
    return scrape(server.url).get(COUNTER % route, 0.0)


@pytest.fixture(scope="module")
def client(tiny_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0)


def test_the_sdks_typed_fields_are_known(tiny_server: Server, client: openai.OpenAI) -> None:
    before = ignored(tiny_server, "/v1/chat/completions"), ignored(tiny_server, "/v1/completions")
    chat = client.chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        store=True, metadata={"run": "ci"}, service_tier="auto", user="u-1",
        safety_identifier="s-1", prompt_cache_key="k",
        prediction={"type": "content", "content": "x"},
        reasoning_effort="low", verbosity="low", web_search_options={}, modalities=["text"],
        parallel_tool_calls=True, seed=3, temperature=0.7, top_p=0.9, presence_penalty=0.5,
        frequency_penalty=0.5, logit_bias={"5": -100}, n=1, stop=["\n\n"], logprobs=True,
        top_logprobs=2,
        extra_body={
            "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True,
            "skip_special_tokens": True, "chat_template_kwargs": {"enable_thinking": False},
        },
    )  # fmt: skip
    assert chat.choices[0].finish_reason == "length"
    stream = client.completions.create(
        model="tgi", prompt="hello", max_tokens=4, stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False}, user="u-1",
        echo=False, best_of=1, suffix=None, logit_bias={"7": 3}, presence_penalty=-1.0,
        extra_body={"top_k": -1, "min_p": 0.2},
    )  # fmt: skip
    usage = next(c.usage for c in stream if c.usage)
    assert usage is not None and usage.completion_tokens == 4
    after = ignored(tiny_server, "/v1/chat/completions"), ignored(tiny_server, "/v1/completions")
    assert after == before  # nothing was unknown


@pytest.mark.parametrize(
    ("route", "body", "names"),
    [
        (
            "/v1/chat/completions",
            {**CHAT, "bogus_field": 1, "stream_options": {"include_usage": True, "zzz": 2}},
            ["bogus_field", "stream_options.zzz"],
        ),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "not_a_field": [1]}, ["not_a_field"]),
        (
            "/generate",
            {"inputs": "hi", "frobnicate": True, "parameters": {"max_new_tokens": 2, "q": 0}},
            ["frobnicate", "parameters.q"],
        ),
    ],
)
def test_an_unknown_field_is_ignored_logged_and_counted(
    tiny_server: Server, route: str, body: dict[str, Any], names: list[str]
) -> None:
    before = ignored(tiny_server, route)
    r = http.post(tiny_server.url + route, json=body)
    assert r.status_code == 200, r.text
    assert ignored(tiny_server, route) == before + len(names)
    line = next(
        line
        for line in reversed(tiny_server.log_tail(400).splitlines())
        if "ignored fields this server does not define" in line and route in line
    )
    assert all(repr(name) in line for name in names), line


@pytest.mark.parametrize(
    ("route", "extra", "param", "needle"),
    [
        ("/v1/chat/completions", {"presence_penalty": 2.5}, "presence_penalty", "or equal to 2"),
        ("/v1/chat/completions", {"frequency_penalty": -3}, "frequency_penalty", "or equal to -2"),
        ("/v1/completions", {"logit_bias": {"1": 101}}, "logit_bias.1", "or equal to 100"),
        ("/v1/completions", {"logit_bias": {"one": 1}}, "logit_bias", "token ids"),
        ("/v1/completions", {"logit_bias": {"320": 1}}, "logit_bias", "[0, 320)"),
        ("/v1/completions", {"logit_bias": {"7": 1, "07": 2}}, "logit_bias", "twice"),
        ("/v1/chat/completions", {"min_p": 1.5}, "min_p", "less than or equal to 1"),
        ("/v1/completions", {"min_p": -0.1}, "min_p", "greater than or equal to 0"),
        ("/v1/chat/completions", {"top_k": -2}, "top_k", "greater than or equal to -1"),
        ("/v1/chat/completions", {"metadata": {str(i): "v" for i in range(17)}}, "metadata", "16"),
        ("/v1/chat/completions", {"store": "yes"}, "store", "boolean"),
        ("/v1/chat/completions", {"audio": {"voice": "alloy"}}, "audio", "not supported"),
        ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities", "text only"),
        ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions", "send `tools`"),
        ("/v1/chat/completions", {"skip_special_tokens": False}, "skip_special_tokens", "always"),
        ("/v1/completions", {"echo": True}, "echo", "not supported"),
        ("/v1/completions", {"best_of": 2}, "best_of", "only n"),
    ],
)  # fmt: skip
def test_bad_values_are_a_400_naming_the_field(
    tiny_server: Server, route: str, extra: dict[str, Any], param: str, needle: str
) -> None:
    base = CHAT if route.endswith("chat/completions") else {"prompt": "hi", "max_tokens": 2}
    r = http.post(tiny_server.url + route, json={**base, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err
    assert needle in err["message"], err


def test_tgi_takes_frequency_penalty_in_its_range(tiny_server: Server) -> None:
    def generate(params: dict[str, Any]) -> Any:
        body = {"inputs": "hi", "parameters": {"max_new_tokens": 12, "details": True, **params}}
        return http.post(tiny_server.url + "/generate", json=body)

    r = generate({"frequency_penalty": 3.0})
    assert r.status_code == 422 and "parameters.frequency_penalty" in r.json()["error"], r.text
    plain, penalised = generate({}).json(), generate({"frequency_penalty": 2.0}).json()
    repeats = [
        max(Counter(t["id"] for t in g["details"]["tokens"]).values()) for g in (plain, penalised)
    ]
    assert repeats[1] <= repeats[0] and penalised["details"]["tokens"] != plain["details"]["tokens"]


@pytest.mark.parametrize("sampled", [False, True])
def test_a_token_biased_by_minus_100_never_appears(tiny_server: Server, sampled: bool) -> None:
    """The token a run emits most, biased by -100 in the same run, is gone from it."""
    sampling: dict[str, Any] = {"temperature": 1.0, "seed": 5} if sampled else {"temperature": 0}
    body = {"prompt": "one two three", "max_tokens": 40, "ignore_eos": True, "logprobs": 0}

    def tokens(**extra: Any) -> list[str]:
        r = http.post(tiny_server.url + "/v1/completions", json={**body, **sampling, **extra})
        assert r.status_code == 200, r.text
        out: list[str] = r.json()["choices"][0]["logprobs"]["tokens"]
        assert len(out) == 40
        return out

    plain = tokens()
    common = Counter(plain).most_common(1)[0][0]
    ids = http.post(tiny_server.url + "/tokenize", json={"prompt": common}).json()["tokens"]
    assert len(ids) == 1, ids
    biased = tokens(logit_bias={str(ids[0]): -100})
    assert common in plain and common not in biased
