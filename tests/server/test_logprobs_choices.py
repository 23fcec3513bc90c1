"""Log-probabilities and n choices over HTTP (tiny model): shapes, streaming, seeds, limits."""

from __future__ import annotations

import json
import math

from tests import http
from tests.server.conftest import Server, idle, sse_events

CHAT = {"messages": [{"role": "user", "content": "one two three one two"}], "max_tokens": 8}


def test_chat_logprobs_are_per_token_with_the_top_alternatives(tiny_server: Server) -> None:
    body = {**CHAT, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    r = http.post(tiny_server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == choice["message"]["content"]
    for e in content:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        assert e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6  # greedy: the best
        assert bytes(e["bytes"]).decode() == e["token"]
    assert math.isclose(content[0]["top_logprobs"][0]["logprob"], content[0]["logprob"])


def test_completion_logprobs_in_the_legacy_form_stream_the_same(tiny_server: Server) -> None:
    # No drafts on either side: the tiny model runs float32 GEMMs, whose rows may round
    # differently when a step verifies another number of drafted rows (within 1e-5, README), and
    # what the adaptive policy verifies depends on what earlier requests taught it.
    body = {
        "prompt": "one two three",
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 2,
        "speculate": 0,
    }
    whole = http.post(tiny_server.url + "/v1/completions", json=body).json()["choices"][0]
    lp = whole["logprobs"]
    assert "".join(lp["tokens"]) == whole["text"] and len(lp["top_logprobs"]) == 6
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(6)]
    with http.stream(
        "POST", tiny_server.url + "/v1/completions", json={**body, "stream": True}
    ) as r:
        chunks = [e for e in sse_events(r.iter_lines()) if e.get("choices")]
    streamed = [t for c in chunks for t in (c["choices"][0]["logprobs"] or {}).get("tokens", [])]
    values = [
        v for c in chunks for v in (c["choices"][0]["logprobs"] or {}).get("token_logprobs", [])
    ]
    assert streamed == lp["tokens"] and values == lp["token_logprobs"]


def test_tgi_details_carry_logprobs_top_tokens_and_the_prefill(tiny_server: Server) -> None:
    params = {
        "max_new_tokens": 5,
        "details": True,
        "top_n_tokens": 2,
        "decoder_input_details": True,
    }
    r = http.post(tiny_server.url + "/generate", json={"inputs": "one two", "parameters": params})
    details = r.json()["details"]
    assert all(t["logprob"] is not None and t["logprob"] <= 0 for t in details["tokens"])
    assert [len(top) for top in details["top_tokens"]] == [2] * 5
    prefill = details["prefill"]
    assert prefill[0]["logprob"] is None and all(p["logprob"] <= 0 for p in prefill[1:])
    body = {"inputs": "one two", "parameters": {"max_new_tokens": 5, "top_n_tokens": 2}}
    with http.stream("POST", tiny_server.url + "/generate_stream", json=body) as s:
        events = list(sse_events(s.iter_lines()))
    # The prefill details computed every prompt position; the stream reused cached blocks.
    streamed = [e["token"]["logprob"] for e in events]
    want = [t["logprob"] for t in details["tokens"]]
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(streamed, want, strict=True))
    assert all(len(e["top_tokens"]) == 2 for e in events)


def test_n_choices_are_seeded_independent_and_reproducible(tiny_server: Server) -> None:
    body = {"prompt": "one two three four", "max_tokens": 12, "temperature": 1.0, "seed": 7,
            "n": 3, "ignore_eos": True}  # fmt: skip
    first = http.post(tiny_server.url + "/v1/completions", json=body).json()
    texts = [c["text"] for c in sorted(first["choices"], key=lambda c: c["index"])]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert len(set(texts)) == 3  # each choice has a seed of its own
    again = http.post(tiny_server.url + "/v1/completions", json=body).json()
    assert [c["text"] for c in again["choices"]] == texts
    one = http.post(tiny_server.url + "/v1/completions", json={**body, "n": 1}).json()
    assert one["choices"][0]["text"] == texts[0]  # choice 0 keeps the request's seed
    assert first["usage"]["completion_tokens"] == 36
    idle(tiny_server.url)  # every choice's blocks freed


def test_streamed_choices_carry_their_index(tiny_server: Server) -> None:
    body = {**CHAT, "temperature": 1.0, "seed": 3, "n": 2, "max_tokens": 10}
    whole = http.post(tiny_server.url + "/v1/chat/completions", json=body).json()
    want = [c["message"]["content"] for c in whole["choices"]]
    got = ["", ""]
    finished = set()
    with http.stream(
        "POST", tiny_server.url + "/v1/chat/completions", json={**body, "stream": True}
    ) as r:
        for e in sse_events(r.iter_lines()):
            for c in e.get("choices", []):
                got[c["index"]] += c["delta"].get("content") or ""
                if c.get("finish_reason"):
                    finished.add(c["index"])
    assert got == want and finished == {0, 1}


def test_choices_share_the_prompts_cached_blocks(tiny_server: Server) -> None:
    before = idle(tiny_server.url)
    prompt = "alpha beta gamma delta " * 3  # several full blocks, under --max-input-tokens 64
    body = {"prompt": prompt, "max_tokens": 3, "temperature": 1.0, "seed": 1, "n": 4}
    r = http.post(tiny_server.url + "/v1/completions", json=body)
    assert r.status_code == 200, r.text
    after = idle(tiny_server.url)
    hits = after["specserve_prefix_cache_hit_tokens_total"]
    hits -= before["specserve_prefix_cache_hit_tokens_total"]
    blocks = json.loads(http.get(tiny_server.url + "/info").text)["memory"]["kv_block_size"]
    prompt_tokens = http.post(tiny_server.url + "/v1/completions", json={**body, "n": 1}).json()
    full = (prompt_tokens["usage"]["prompt_tokens"] - 1) // blocks * blocks
    assert hits >= 3 * full  # choices 1..3 reused choice 0's full prompt blocks
