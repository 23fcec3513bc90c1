"""Each bad input gets a 4xx whose message names the field and the limit; the server goes on."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests import http
from tests.server.conftest import Server

LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 30  # > 64 tokens


def tgi(server: Server, parameters: dict[str, object], inputs: str = "Hello") -> httpx.Response:
    return http.post(server.url + "/generate", json={"inputs": inputs, "parameters": parameters})


@pytest.mark.parametrize(
    ("parameters", "needles"),
    [
        ({"max_new_tokens": -1}, ["parameters.max_new_tokens", "greater than or equal to 1"]),
        ({"max_new_tokens": 0}, ["parameters.max_new_tokens", "1"]),
        ({"temperature": -0.5}, ["parameters.temperature", "greater than 0"]),
        ({"temperature": 0}, ["parameters.temperature", "greater than 0"]),
        ({"top_p": 0}, ["parameters.top_p", "greater than 0"]),
        ({"top_p": 1.5}, ["parameters.top_p", "less than or equal to 1"]),
        ({"top_k": 0}, ["parameters.top_k", "greater than 0"]),
        ({"repetition_penalty": 0}, ["parameters.repetition_penalty", "greater than 0"]),
        ({"speculate": 5}, ["parameters.speculate", "between 0 and 4", "--speculate"]),
        ({"speculate": -1}, ["parameters.speculate", "greater than or equal to 0"]),
        ({"max_new_tokens": 5000}, ["parameters.max_new_tokens", "4096", "--max-total-tokens"]),
        ({"stop": ["a", "b", "c", "d", "e"]}, ["parameters.stop", "at most 4"]),
        ({"stop": [""]}, ["parameters.stop", "non-empty"]),
        ({"stop": ["x" * 257]}, ["parameters.stop", "at most 256 characters", "257"]),
        ({"best_of": 2}, ["parameters.best_of", "max_best_of is 1"]),
        ({"truncate": 100}, ["parameters.truncate", "64", "--max-input-tokens"]),
        ({"top_n_tokens": 21}, ["parameters.top_n_tokens", "between 0 and 20"]),
        ({"watermark": True}, ["parameters.watermark", "not supported"]),
        ({"frequency_penalty": 2.5}, ["parameters.frequency_penalty", "less than or equal to 2"]),
        ({"max_new_tokens": "many"}, ["parameters.max_new_tokens", "integer"]),
    ],
)
def test_tgi_bad_parameters(
    tiny_server: Server, parameters: dict[str, object], needles: list[str]
) -> None:
    r = tgi(tiny_server, parameters)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error_type"] == "validation"
    for needle in needles:
        assert needle in body["error"], body["error"]


def test_prompt_over_max_input_tokens(tiny_server: Server) -> None:
    r = tgi(tiny_server, {}, inputs=LONG_PROMPT)
    assert r.status_code == 422
    assert "inputs" in r.json()["error"] and "64 (--max-input-tokens)" in r.json()["error"]
    r = http.post(tiny_server.url + "/v1/completions", json={"prompt": LONG_PROMPT})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "prompt" and "64" in err["message"]
    chat = {"messages": [{"role": "user", "content": LONG_PROMPT}]}
    r = http.post(tiny_server.url + "/v1/chat/completions", json=chat)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_empty_and_missing_inputs(tiny_server: Server) -> None:
    r = tgi(tiny_server, {}, inputs="")
    assert r.status_code == 422 and "inputs: must not be empty" in r.json()["error"]
    r = http.post(tiny_server.url + "/generate", json={"parameters": {}})
    assert r.status_code == 422 and "inputs: Field required" in r.json()["error"]


@pytest.mark.parametrize("route", ["/generate", "/generate_stream", "/v1/completions"])
def test_invalid_json(tiny_server: Server, route: str) -> None:
    r = http.post(
        tiny_server.url + route,
        content=b'{"inputs": "x",',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    text = r.text
    assert "not valid JSON" in text


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"prompt": "hi", "max_tokens": -3}, "max_tokens", "greater than or equal to 1"),
        ({"prompt": "hi", "temperature": -1}, "temperature", "greater than or equal to 0"),
        ({"prompt": "hi", "temperature": 3}, "temperature", "less than or equal to 2"),
        ({"prompt": "hi", "top_p": 0}, "top_p", "greater than 0"),
        ({"prompt": "hi", "speculate": 9}, "speculate", "between 0 and 4"),
        ({"prompt": "hi", "n": 9}, "n", "<= 8 (--max-choices)"),
        ({"prompt": "hi", "logprobs": 21}, "logprobs", "between 0 and 20"),
        ({"prompt": "hi", "echo": True}, "echo", "not supported"),
        ({"prompt": "hi", "stop": "x" * 257}, "stop", "at most 256 characters"),
        ({"prompt": "hi", "max_tokens": 5000}, "max_tokens", "4096"),
        ({"prompt": ["a", "b"]}, "prompt", "one prompt"),
        ({"prompt": [1, 2, 999999]}, "prompt", "token ids must be in [0, 320)"),
        ({"prompt": "hi", "frequency_penalty": 2.5}, "frequency_penalty", "or equal to 2"),
        ({"prompt": "hi", "suffix": "x"}, "suffix", "not supported"),
    ],
)
def test_openai_bad_parameters(
    tiny_server: Server, body: dict[str, object], param: str, needle: str
) -> None:
    r = http.post(tiny_server.url + "/v1/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert param in err["message"] and needle in err["message"], err["message"]


def test_chat_top_logprobs_needs_logprobs_and_a_cap(tiny_server: Server) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for extra, needle in (
        ({"top_logprobs": 2}, "needs logprobs: true"),
        ({"logprobs": True, "top_logprobs": 21}, "between 0 and 20"),
    ):
        r = http.post(tiny_server.url + "/v1/chat/completions", json={**chat, **extra})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "top_logprobs" and needle in err["message"], err


def test_openai_temperature_zero_is_greedy(tiny_server: Server) -> None:
    body = {"prompt": "The quick brown", "max_tokens": 6, "temperature": 0, "seed": 1}
    a = http.post(tiny_server.url + "/v1/completions", json=body).json()
    b = http.post(tiny_server.url + "/v1/completions", json={**body, "seed": 2}).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_chat_rejects_malformed_tools_and_bad_roles(tiny_server: Server) -> None:
    url = tiny_server.url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    r = http.post(url, json={"messages": msgs, "tools": [{"type": "function"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]"
    r = http.post(url, json={"messages": [{"role": "robot", "content": "hi"}]})
    assert r.status_code == 400 and "messages[0].role" in r.json()["error"]["message"]
    r = http.post(url, json={"messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


def test_body_over_limit_gets_413(tiny_server: Server) -> None:
    big = b'{"inputs": "' + b"a" * 300_000 + b'"}'
    headers = {"content-type": "application/json"}
    r = http.post(tiny_server.url + "/generate", content=big, headers=headers)
    assert r.status_code == 413 and "200000" in r.json()["error"]

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
        yield b'{"inputs": "'
        for _ in range(30):
            yield b"a" * 10_000
        yield b'"}'

    r = http.post(tiny_server.url + "/v1/completions", content=chunked(), headers=headers)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"
    assert tgi(tiny_server, {"max_new_tokens": 2}).status_code == 200


# --------------------------------------------------------------- encodings and empty bodies
@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/generate", '{"inputs": "hi \\ud800 x"}'),
        ("/generate_stream", '{"inputs": "hi", "parameters": {"stop": ["\\udfff"]}}'),
        ("/v1/completions", '{"prompt": "a \\ud83d b"}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}'),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
        ),
    ],
)
def test_lone_surrogate_is_a_4xx(tiny_server: Server, route: str, body: str) -> None:
    headers = {"content-type": "application/json"}
    r = http.post(tiny_server.url + route, content=body.encode(), headers=headers)
    assert r.status_code == (400 if route.startswith("/v1/") else 422), r.text
    assert "lone surrogate" in r.text and "valid Unicode" in r.text
    assert tgi(tiny_server, {"max_new_tokens": 2}).status_code == 200


@pytest.mark.parametrize("route", ["/generate", "/generate_stream", "/v1/completions"])
def test_non_utf8_body_gets_400_in_the_family_shape(tiny_server: Server, route: str) -> None:
    body = b'{"inputs": "caf\xe9", "prompt": "caf\xe9"}'  # latin-1, not UTF-8
    r = http.post(
        tiny_server.url + route, content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    if route.startswith("/v1/"):
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "UTF-8" in err["message"]
    else:
        assert r.json()["error_type"] == "validation" and "UTF-8" in r.json()["error"]


@pytest.mark.parametrize(
    ("route", "field"),
    [("/generate", "inputs"), ("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")],
)
def test_empty_body_names_what_is_missing(tiny_server: Server, route: str, field: str) -> None:
    r = http.post(tiny_server.url + route, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422)
    text = r.text
    assert "body: missing" in text and field in text, text


# ---------------------------------------------------------------------- strict like OpenAI
@pytest.mark.parametrize("value", [True, "5", 5.0])
def test_wrong_json_types_are_refused(tiny_server: Server, value: object) -> None:
    r = tgi(tiny_server, {"max_new_tokens": value})
    assert r.status_code == 422 and "parameters.max_new_tokens" in r.json()["error"], r.text
    r = http.post(tiny_server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


def test_unknown_model_is_404_model_not_found(tiny_server: Server) -> None:
    for route, body in [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
    ]:
        r = http.post(tiny_server.url + route, json={**body, "model": "gpt-4"})
        assert r.status_code == 404, r.text
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert "gpt-4" in err["message"]
        served = http.get(tiny_server.url + "/v1/models").json()["data"][0]["id"]
        short = served.rstrip("/").rsplit("/", 1)[-1]
        for name in (served, short, short.upper(), "tgi"):  # TGI clients: "tgi" = this model
            r = http.post(tiny_server.url + route, json={**body, "model": name})
            assert r.status_code == 200, (name, r.text)


def test_max_tokens_and_max_completion_tokens_must_agree(tiny_server: Server) -> None:
    url = tiny_server.url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    r = http.post(url, json={"messages": msgs, "max_tokens": 3, "max_completion_tokens": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"
    assert "conflicts with max_tokens" in r.json()["error"]["message"]
    r = http.post(url, json={"messages": msgs, "max_tokens": 3, "max_completion_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


def test_retrieve_model_and_head_health(tiny_server: Server) -> None:
    served = http.get(tiny_server.url + "/v1/models").json()["data"][0]
    r = http.get(f"{tiny_server.url}/v1/models/{served['id']}")
    assert r.status_code == 200 and r.json() == served
    r = http.get(tiny_server.url + "/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.head(tiny_server.url + "/health")
    assert r.status_code == 200 and r.content == b""
    r = http.get(tiny_server.url + "/v1/no-such-route")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
