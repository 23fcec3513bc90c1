"""Every JSON reply holds finite numbers only, and sampling parameters are bounded and finite
(issue 24, item 5): -inf log-probabilities of tokens top-k/top-p removed are reported as -9999.0
(vLLM's value), and Infinity, NaN, absurd penalties are a 4xx."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests import http
from tests.server.conftest import Server


def numbers(value: Any) -> list[float]:
    """Every number in a decoded JSON value."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in numbers(v)]
    return []


def test_tgi_top_n_tokens_after_top_k_is_finite(tiny_server: Server) -> None:
    body = {"inputs": "hi", "parameters": {"top_k": 2, "top_n_tokens": 5, "details": True}}
    r = http.post(tiny_server.url + "/generate", json=body)
    assert r.status_code == 200, r.text
    details = r.json()["details"]
    assert all(math.isfinite(x) for x in numbers(r.json()))
    for top in details["top_tokens"]:
        assert len(top) == 5
        assert [t["logprob"] for t in top][2:] == [-9999.0] * 3  # removed by top_k


def test_chat_top_logprobs_after_top_p_is_finite(tiny_server: Server) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "top_p": 0.01,
        "logprobs": True,
        "top_logprobs": 3,
    }
    r = http.post(tiny_server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert all(math.isfinite(x) for x in numbers(r.json()))
    assert r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["logprob"] == -9999


def test_tiny_temperature_samples_finite_numbers(tiny_server: Server) -> None:
    params = {"temperature": 1e-30, "max_new_tokens": 4, "details": True, "top_n_tokens": 2}
    r = http.post(tiny_server.url + "/generate", json={"inputs": "hi", "parameters": params})
    assert r.status_code == 200, r.text
    assert all(math.isfinite(x) for x in numbers(r.json()))


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/generate", {"inputs": "hi", "parameters": {"temperature": "inf"}}, "temperature"),
        ("/generate", {"inputs": "hi", "parameters": {"top_p": "nan"}}, "top_p"),
        ("/generate", {"inputs": "hi", "parameters": {"repetition_penalty": "inf"}}, "penalty"),
        ("/v1/completions", {"prompt": "hi", "repetition_penalty": "nan"}, "repetition_penalty"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"1": "-inf"}}, "logit_bias"),
    ],
)
def test_non_finite_floats_are_a_4xx(
    tiny_server: Server, route: str, body: dict[str, Any], param: str
) -> None:
    # JSON has no Infinity or NaN, but Python's parser takes the spellings below.
    raw = json.dumps(body).replace('"inf"', "Infinity").replace('"-inf"', "-Infinity")
    raw = raw.replace('"nan"', "NaN")
    headers = {"content-type": "application/json"}
    r = http.post(tiny_server.url + route, content=raw.encode(), headers=headers)
    assert r.status_code == (400 if route.startswith("/v1/") else 422), r.text
    assert param in r.text and "finite" in r.text, r.text


def test_repetition_penalty_is_bounded(tiny_server: Server) -> None:
    body = {"inputs": "hi", "parameters": {"repetition_penalty": 101.0}}
    r = http.post(tiny_server.url + "/generate", json=body)
    assert r.status_code == 422
    assert "parameters.repetition_penalty" in r.text and "100" in r.text
    r = http.post(
        tiny_server.url + "/v1/completions", json={"prompt": "hi", "repetition_penalty": 1e9}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "repetition_penalty"


def test_info_numbers_are_finite(tiny_server: Server) -> None:
    http.post(tiny_server.url + "/generate", json={"inputs": "hi", "parameters": {
        "max_new_tokens": 8, "top_k": 2, "details": True}})  # fmt: skip
    r = http.get(tiny_server.url + "/info")
    assert r.status_code == 200, r.text
    assert all(math.isfinite(x) for x in numbers(r.json()))
