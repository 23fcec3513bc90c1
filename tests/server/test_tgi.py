"""TGI routes against a real server on the tiny model: shapes, semantics, /info, /health."""

from __future__ import annotations

from collections.abc import Mapping

from tests import http
from tests.server.conftest import Server, sse_events

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"


def generate(server: Server, parameters: Mapping[str, object], route: str = "/generate") -> dict:
    r = http.post(server.url + route, json={"inputs": PROMPT, "parameters": parameters})
    assert r.status_code == 200, r.text
    body: dict = r.json()
    return body


def stream(server: Server, parameters: Mapping[str, object]) -> list[dict]:
    body = {"inputs": PROMPT, "parameters": parameters}
    with http.stream("POST", server.url + "/generate_stream", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(sse_events(r.iter_lines()))


def test_generate_details_shape(tiny_server: Server) -> None:
    out = generate(tiny_server, {"max_new_tokens": 12, "details": True, "ignore_eos": True})
    d = out["details"]
    assert d["finish_reason"] == "length"
    assert d["generated_tokens"] == 12 == len(d["tokens"])
    assert d["seed"] is None  # greedy
    assert set(d["tokens"][0]) == {"id", "text", "logprob", "special"}
    assert 0 <= d["accepted_tokens"] <= d["drafted_tokens"]


def test_stream_matches_generate_and_carries_details(tiny_server: Server) -> None:
    # static drafts: the draft counts are compared, which the adaptive default takes from
    # measured step times (the same drafts either way, so the same verified rows)
    params = {
        "max_new_tokens": 20,
        "details": True,
        "ignore_eos": True,
        "speculation_policy": "static",
    }
    whole = generate(tiny_server, params)
    events = stream(tiny_server, params)
    assert [e["index"] for e in events] == list(range(1, 21))
    assert all(e["generated_text"] is None for e in events[:-1])
    last = events[-1]
    assert last["generated_text"] == whole["generated_text"]
    assert "".join(e["token"]["text"] for e in events) == whole["generated_text"]
    assert [e["token"]["id"] for e in events] == [t["id"] for t in whole["details"]["tokens"]]
    det = last["details"]
    assert det["finish_reason"] == "length" and det["generated_tokens"] == 20
    assert det["input_length"] > 0
    assert det["drafted_tokens"] == whole["details"]["drafted_tokens"]
    assert det["speculation_steps"] == whole["details"]["speculation_steps"]


def test_stream_without_details_has_none(tiny_server: Server) -> None:
    events = stream(tiny_server, {"max_new_tokens": 3, "ignore_eos": True})
    assert events[-1]["details"] is None and events[-1]["generated_text"] is not None


def test_compat_route_dispatches_on_stream(tiny_server: Server) -> None:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 5}}
    r = http.post(tiny_server.url + "/", json=body)
    assert r.status_code == 200 and isinstance(r.json(), list)
    with http.stream("POST", tiny_server.url + "/", json={**body, "stream": True}) as s:
        events = list(sse_events(s.iter_lines()))
    assert events[-1]["generated_text"] == r.json()[0]["generated_text"]


def test_greedy_ignores_seed_and_do_sample_false(tiny_server: Server) -> None:
    a = generate(tiny_server, {"max_new_tokens": 8, "seed": 1})
    b = generate(tiny_server, {"max_new_tokens": 8, "seed": 2, "do_sample": False})
    assert a["generated_text"] == b["generated_text"]


def test_sampling_is_seeded_and_reports_seed(tiny_server: Server) -> None:
    params = {"max_new_tokens": 8, "temperature": 5.0, "seed": 42, "details": True}
    a, b = generate(tiny_server, params), generate(tiny_server, params)
    assert a["generated_text"] == b["generated_text"]
    assert a["details"]["seed"] == 42
    unseeded = generate(tiny_server, {"max_new_tokens": 2, "do_sample": True, "details": True})
    assert isinstance(unseeded["details"]["seed"], int)


def test_speculation_does_not_change_greedy_output(tiny_server: Server) -> None:
    base = {"max_new_tokens": 24, "ignore_eos": True, "details": True}
    on = generate(tiny_server, base)
    off = generate(tiny_server, {**base, "speculate": 0})
    assert on["generated_text"] == off["generated_text"]
    assert off["details"]["drafted_tokens"] == 0


def test_return_full_text_and_stop(tiny_server: Server) -> None:
    full = generate(tiny_server, {"max_new_tokens": 4, "return_full_text": True})
    assert full["generated_text"].startswith(PROMPT)
    plain = generate(tiny_server, {"max_new_tokens": 12, "ignore_eos": True})["generated_text"]
    stop = plain[3:6]
    cut = generate(
        tiny_server,
        {"max_new_tokens": 12, "stop": [stop], "details": True, "ignore_eos": True},
    )
    assert cut["details"]["finish_reason"] == "stop_sequence"
    assert cut["generated_text"] == plain[: plain.index(stop)]


def test_decoder_input_details_and_truncate(tiny_server: Server) -> None:
    out = generate(
        tiny_server,
        {"max_new_tokens": 1, "details": True, "decoder_input_details": True, "truncate": 3},
    )
    assert len(out["details"]["prefill"]) == 3


def test_info_and_health(tiny_server: Server) -> None:
    assert http.get(tiny_server.url + "/health").status_code == 200
    info = http.get(tiny_server.url + "/info").json()
    assert info["max_input_tokens"] == 64 and info["max_total_tokens"] == 4096
    assert info["max_concurrent_requests"] == 4
    assert info["max_running_requests"] == 64
    spec = info["speculation"]
    calibration = spec.pop("calibration")
    assert len(calibration) == 10 and calibration[0]["low"] == 0.0
    assert spec.pop("cost_curve") is not None  # the adaptive default profiles at start-up
    for traffic in ("live_cost", "proposed_tokens", "trimmed_tokens", "skipped_steps",
                    "unpaid_steps", "payoff", "paused_sequence_steps",
                    "proposer_call_ms"):  # fmt: skip
        spec.pop(traffic)  # what earlier tests' requests left
    assert spec == {
        "speculate": 4,
        "proposer": "ngram",
        "configured_proposer": "auto",
        "draft_model": None,
        "policy": "adaptive",
        "max_batch": None,
        "max_tokens": None,
        "suffix_cache": None,
    }
    assert info["speculation_profile"] is None
    fps = info["fingerprints"]
    assert len(fps["target"]["weights_sha256"]) == 64
    assert fps["proposer"] == {"kind": "ngram", "artifact": None}
    mem = info["memory"]
    assert mem["weights_bytes"] > 0 and mem["kv_cache_bytes"] > 0
    assert mem["kv_cache_dtype"] == "float16"  # the default where the CPU kernel reads it
    assert mem["kv_cache_tokens"] == mem["kv_blocks"] * mem["kv_block_size"]
    assert info["model_dtype"] == "float32" and info["model_device_type"] == "cpu"
    assert info["model_weight_blocks"] == []  # a safetensors model: plain float32 weights
    assert info["model_numerics"] is None  # no block weights, so no block numerics
    assert info["model_q8_kernels"] is None
    assert info["attention"] == "ragged"  # CPU float32: decode rows read the paged cache in place
    assert info["model_block_kernel_fallback"] is None
