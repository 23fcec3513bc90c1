"""Caps on work outside the engine (issue 24, item 4): the formatting of a non-streaming reply
with log-probabilities, and prompt characters checked before tokenising."""

from __future__ import annotations

import pytest

from specserve.server.errors import ApiError
from specserve.server.openai_schemas import ChatCompletionRequest, CompletionRequest
from specserve.server.params import prepare_chat, prepare_completion, prepare_tgi
from specserve.server.schemas import GenerateRequest
from specserve.server.settings import Limits
from tests import http
from tests.server.conftest import Server
from tests.server.test_params import encode

LIMITS = Limits(
    max_input_tokens=16,
    max_total_tokens=100_000,
    kv_capacity_tokens=100_000,
    speculate=0,
    max_stop_sequences=4,
    vocab_size=100,
    max_choices=8,
    max_prompt_chars=40,
)


def chat(**fields: object) -> ChatCompletionRequest:
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def test_non_streaming_logprob_work_is_capped() -> None:
    big = {"n": 8, "max_tokens": 1000, "logprobs": True, "top_logprobs": 20}
    with pytest.raises(ApiError) as err:
        prepare_chat(chat(**big), lambda m: encode(m[0]["content"]), LIMITS)
    assert err.value.param == "top_logprobs"
    assert "168000" in err.value.message and "at most 100000" in err.value.message
    prepare_chat(chat(**big, stream=True), lambda m: encode(m[0]["content"]), LIMITS)
    prepare_chat(chat(**{**big, "n": 4}), lambda m: encode(m[0]["content"]), LIMITS)
    req = CompletionRequest.model_validate({"prompt": "hi", "max_tokens": 9000, "logprobs": 20})
    with pytest.raises(ApiError, match="stream it"):
        prepare_completion(req, encode, LIMITS)
    params = {"max_new_tokens": 9000, "details": True, "top_n_tokens": 20}
    tgi = {"inputs": "hi", "parameters": params}
    with pytest.raises(ApiError, match=r"parameters\.max_new_tokens"):
        prepare_tgi(GenerateRequest.model_validate(tgi), encode, LIMITS)
    prepare_tgi(GenerateRequest.model_validate(tgi), encode, LIMITS, stream=True)


def test_prompt_characters_are_checked_before_encoding() -> None:
    def refuse(text: object) -> list[int]:
        raise AssertionError("tokenised")

    long = "x" * 41
    with pytest.raises(ApiError, match="inputs: has 41 characters; the limit is 40"):
        prepare_tgi(GenerateRequest.model_validate({"inputs": long}), refuse, LIMITS)
    with pytest.raises(ApiError, match="prompt: has 41 characters"):
        prepare_completion(CompletionRequest.model_validate({"prompt": long}), refuse, LIMITS)
    req = chat(messages=[{"role": "user", "content": long}])
    with pytest.raises(ApiError, match="messages: has 41 characters"):
        prepare_chat(req, refuse, LIMITS)
    truncated = {"inputs": long, "parameters": {"truncate": 4}}  # may be long: keeps the tail
    assert (
        len(prepare_tgi(GenerateRequest.model_validate(truncated), encode, LIMITS).prompt_ids) == 4
    )


def test_the_reply_cap_over_http_in_both_shapes(tiny_server: Server) -> None:
    chat = {
        "messages": [{"role": "user", "content": "hi"}],
        "n": 4,
        "max_tokens": 4000,
        "logprobs": True,
        "top_logprobs": 20,
    }
    r = http.post(tiny_server.url + "/v1/chat/completions", json=chat)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "top_logprobs" and "at most 100000" in err["message"]
    body = {"prompt": "hi", "max_tokens": 4000, "logprobs": 20, "n": 2}
    r = http.post(tiny_server.url + "/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs", r.text
    streamed = {**body, "stream": True}  # a stream formats as it goes: no cap
    with http.stream("POST", tiny_server.url + "/v1/completions", json=streamed) as s:
        assert s.status_code == 200
        assert next(s.iter_lines()).startswith("data: ")  # leaving aborts it
