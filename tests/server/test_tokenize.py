"""/tokenize and /detokenize in TGI's and vLLM's shapes."""

from __future__ import annotations

from tests import http
from tests.server.conftest import Server


def test_tgi_tokenize_gives_ids_with_character_offsets(tiny_server: Server) -> None:
    text = "def add(a, b):"
    r = http.post(tiny_server.url + "/tokenize", json={"inputs": text})
    assert r.status_code == 200, r.text
    tokens = r.json()
    assert "".join(t["text"] for t in tokens) == text
    assert all(text[t["start"] : t["stop"]] == t["text"] for t in tokens)
    gen = {"inputs": text, "parameters": {"max_new_tokens": 1, "details": True}}
    details = http.post(tiny_server.url + "/generate", json=gen).json()["details"]
    assert details["prefill"] == [] and len(tokens) > 1


def test_vllm_tokenize_prompt_and_messages_round_trip(tiny_server: Server) -> None:
    r = http.post(tiny_server.url + "/tokenize", json={"prompt": "one two three"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] > 0
    back = http.post(tiny_server.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back == {"prompt": "one two three"}
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    templated = http.post(tiny_server.url + "/tokenize", json=chat).json()
    body = {"messages": chat["messages"], "max_tokens": 1}
    usage = http.post(tiny_server.url + "/v1/chat/completions", json=body).json()["usage"]
    assert templated["count"] == usage["prompt_tokens"]  # what a chat request is fed


def test_bad_tokenize_bodies_are_4xx(tiny_server: Server) -> None:
    for body, needle in (
        ({}, "exactly one"),
        ({"inputs": "a", "prompt": "b"}, "exactly one"),
        ({"prompt": "a", "add_special_tokens": True}, "only false"),
        ({"messages": []}, "at least 1"),
    ):
        r = http.post(tiny_server.url + "/tokenize", json=body)
        assert r.status_code in (400, 422) and needle in r.text, (body, r.text)
    r = http.post(tiny_server.url + "/detokenize", json={"tokens": [10**9]})
    assert r.status_code in (400, 422) and "token ids must be in" in r.text
