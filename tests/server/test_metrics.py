"""/metrics parses with prometheus-client's parser, names follow conventions, counters move."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from specserve.engine.async_engine import AsyncEngine
from specserve.request import SamplingParams
from specserve.server.metrics import Coalesced
from tests import http
from tests.engine.helpers import make_engine
from tests.engine.observers import HoldSteps
from tests.server.conftest import Server, idle, scrape

EXPECTED = {
    "specserve_requests": "counter",
    "specserve_requests_in_flight": "gauge",
    "specserve_request_queue_seconds": "histogram",
    "specserve_time_to_first_token_seconds": "histogram",
    "specserve_inter_token_latency_seconds": "histogram",
    "specserve_request_duration_seconds": "histogram",
    "specserve_request_input_tokens": "histogram",
    "specserve_request_output_tokens": "histogram",
    "specserve_batch_size": "gauge",
    "specserve_queue_size": "gauge",
    "specserve_kv_cache_blocks_used": "gauge",
    "specserve_kv_cache_blocks": "gauge",
    "specserve_preemptions": "counter",
    "specserve_generated_tokens": "counter",
    "specserve_engine_steps": "counter",
    "specserve_spec_drafts": "counter",
    "specserve_spec_drafted_tokens": "counter",
    "specserve_spec_accepted_tokens": "counter",
    "specserve_spec_accepted_tokens_by_position": "counter",
    "specserve_spec_k_chosen": "histogram",
    "specserve_spec_gated_steps": "counter",
    "specserve_block_kernels_fallback": "gauge",
    "specserve_prefix_cache_queried_tokens": "counter",
    "specserve_prefix_cache_hit_tokens": "counter",
    "specserve_prefix_cache_evicted_blocks": "counter",
    "specserve_kv_cache_blocks_cached": "gauge",
}
# Copy-heavy: the n-gram proposer finds the continuation in the prompt itself.
COPY_PROMPT = "one two three four five six seven eight one two three four five six"


def test_metrics_parse_with_expected_families(tiny_server: Server) -> None:
    http.post(tiny_server.url + "/generate", json={"inputs": "hi"})
    r = http.get(tiny_server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f.type for f in text_string_to_metric_families(r.text)}
    for name, kind in EXPECTED.items():
        assert families.get(name) == kind, (name, families.get(name))
    for name in families:
        assert name.startswith("specserve_"), name
    assert "_created" not in r.text


def test_speculation_counters_move_when_speculating(tiny_server: Server) -> None:
    before = idle(tiny_server.url)
    body = {
        "inputs": COPY_PROMPT,
        # static: drafts whatever the adaptive policy's shared payoff learnt from earlier tests
        # (on a busy CI machine it had closed, and 40 tokens drafted none: a9c9108)
        "parameters": {
            "max_new_tokens": 40,
            "ignore_eos": True,
            "details": True,
            "speculation_policy": "static",
        },
    }
    details = http.post(tiny_server.url + "/generate", json=body).json()["details"]
    after = idle(tiny_server.url)

    def moved(key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    drafted = 'specserve_spec_drafted_tokens_total{proposer="ngram"}'
    accepted = 'specserve_spec_accepted_tokens_total{proposer="ngram"}'
    assert moved(drafted) == details["drafted_tokens"] > 0
    assert moved(accepted) == details["accepted_tokens"]
    assert (
        0 < details["speculation_steps"] <= moved('specserve_engine_steps_total{speculation="on"}')
    )
    assert moved("specserve_generated_tokens_total") == 40
    assert moved('specserve_requests_total{outcome="success",route="/generate"}') == 1
    assert moved("specserve_request_output_tokens_sum") == 40
    assert moved("specserve_time_to_first_token_seconds_count") == 1
    if details["accepted_tokens"]:
        pos0 = 'specserve_spec_accepted_tokens_by_position_total{position="0",proposer="ngram"}'
        assert moved(pos0) > 0


def test_speculate_zero_request_drafts_nothing(tiny_server: Server) -> None:
    before = idle(tiny_server.url)
    body = {"inputs": COPY_PROMPT, "parameters": {"max_new_tokens": 20, "speculate": 0}}
    assert http.post(tiny_server.url + "/generate", json=body).status_code == 200
    after = scrape(tiny_server.url)
    drafted = 'specserve_spec_drafted_tokens_total{proposer="ngram"}'
    assert after.get(drafted, 0) == before.get(drafted, 0)
    assert (
        after['specserve_engine_steps_total{speculation="off"}']
        > before['specserve_engine_steps_total{speculation="off"}']
    )


def test_prefix_cache_counters_move_on_a_repeated_prompt(tiny_server: Server) -> None:
    body = {"inputs": COPY_PROMPT, "parameters": {"max_new_tokens": 4}}
    http.post(tiny_server.url + "/generate", json=body).raise_for_status()
    before = idle(tiny_server.url)
    http.post(tiny_server.url + "/generate", json=body).raise_for_status()
    after = idle(tiny_server.url)
    queried = after["specserve_prefix_cache_queried_tokens_total"]
    hit = after["specserve_prefix_cache_hit_tokens_total"]
    assert queried > before["specserve_prefix_cache_queried_tokens_total"]
    assert hit - before["specserve_prefix_cache_hit_tokens_total"] > 0
    assert after["specserve_kv_cache_blocks_cached"] > 0
    info = http.get(tiny_server.url + "/info").json()["memory"]
    assert info["prefix_caching"] is True and info["kv_blocks_cached"] > 0


def test_concurrent_scrapes_share_one_engine_read() -> None:
    """Issue 54 item 9: every scrape of the public /metrics took the engine's lock. Scrapes
    that arrive while a read is under way now share it."""
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def read() -> int:
        calls.append(1)
        entered.set()
        release.wait()
        return len(calls)

    shared = Coalesced(read)
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(shared())) for _ in range(5)]
    threads[0].start()
    assert entered.wait(60)
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 60  # a bound on failure only
    while shared.waiting < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    release.set()
    for t in threads:
        t.join()
    assert calls == [1] and results == [1] * 5
    assert shared() == 2  # once it is done, the next scrape reads anew


def test_a_read_while_a_step_runs_is_made_by_the_step_thread(tiny_llama: Path) -> None:
    """The engine's part of a scrape is read between steps by the step thread itself while a
    step runs, so a scrape never waits on (or takes turns with the step thread for) its lock."""
    engine = make_engine(tiny_llama)
    held = HoldSteps(engine)
    stepping, release = held.stepping, held.release
    engine.observers.add(held)
    async_engine = AsyncEngine(engine)

    async def generate() -> None:
        async for _ in async_engine.generate("hi", SamplingParams(max_new_tokens=4)):
            pass

    request = threading.Thread(target=lambda: asyncio.run(generate()))
    request.start()
    assert stepping.wait(60)
    readers: list[str] = []

    def read(e: object) -> int:
        readers.append(threading.current_thread().name)
        return 7

    got: list[int] = []
    scrape_ = threading.Thread(target=lambda: got.append(async_engine.read_between_steps(read)))
    scrape_.start()
    release.set()
    scrape_.join()
    request.join()
    assert got == [7] and readers == ["specserve-engine"]
    assert async_engine.read_between_steps(read) == 7  # idle: read at once, here
    assert readers[-1] == threading.current_thread().name
    asyncio.run(async_engine.shutdown())
