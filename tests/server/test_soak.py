"""Soak: many mixed requests against one server, then nothing may be left behind.

Slow; run it with (the request count and concurrency are parameters):

    SPECSERVE_SOAK_REQUESTS=10000 .venv/bin/python -m pytest -m slow tests/server/test_soak.py -s

The server runs the tiny random model with a noisy copy of it as the draft model (--speculate 3)
on a small KV pool (288 tokens for 8 concurrent requests of up to 112), so preemptions happen.
Requests are drawn from a seeded mix: every generation route of both APIs, streaming or not,
greedy or sampled, speculation on or off (`speculate: 0`), about 10 % cut off (a stream closed
mid-way, a non-streaming client that gives up) and about 1 % invalid (each must get a 4xx).
With SPECSERVE_SOAK_ABUSE=1 about 3 % more are abuse: four 256-character stop strings on a long
reply, top-k with top_n_tokens (-inf log-probabilities), 2 MB prompts, /tokenize of 200 kB,
`grammar` nested 900 deep; each must get a 200 or a 4xx. The summary reports the ordinary
streams' inter-token gaps (p50, p99), to compare with a soak without abuse.
Afterwards: no 5xx at all (none is injected here), every valid request answered 200, 0 KV
blocks held (target and draft), nothing in flight, the server's RSS flat within 5 % over the
last half, and greedy probes answered the same at the end as at the start, with and without
speculation. With `-s` it prints a summary line; SPECSERVE_SOAK_OUT=path.json writes it to a file.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import http
from tests.server.conftest import Server, idle, scrape, start_server
from tests.tiny import noisy_copy

pytestmark = pytest.mark.slow
REQUESTS = int(os.environ.get("SPECSERVE_SOAK_REQUESTS", "10000"))
ABUSE = os.environ.get("SPECSERVE_SOAK_ABUSE", "0") == "1"
CONCURRENCY = int(os.environ.get("SPECSERVE_SOAK_CONCURRENCY", "8"))
WORDS = [
    "def",
    "add",
    "return",
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "speculative",
    "tokens",
]


@dataclass(frozen=True)
class Shot:
    """One request of the mix."""

    route: str
    body: dict[str, Any] | bytes
    stream: bool
    cut_after: int | None  # events read before closing (streams), or None
    give_up_s: float | None  # client timeout for a non-streaming request that gives up
    invalid: bool
    abuse: bool = False  # 200 or 4xx, never 5xx; not an ordinary request


def make_shot(i: int) -> Shot:
    rng = random.Random(i)
    if rng.random() < 0.01:
        return _invalid(rng)
    if ABUSE and rng.random() < 0.03:
        return _abuse(rng)
    route = rng.choice(["/generate", "/generate_stream", "/v1/completions", "/v1/chat/completions"])
    stream = route == "/generate_stream" or (route.startswith("/v1/") and rng.random() < 0.5)
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
    sampled = rng.random() < 0.5
    extra: dict[str, Any] = {
        "ignore_eos": rng.random() < 0.7,
        **({"speculate": 0} if rng.random() < 0.3 else {}),
    }
    n = rng.randint(1, 48)
    if route.startswith("/generate"):
        p = {"max_new_tokens": n, **extra}
        if sampled:
            p |= {"do_sample": True, "temperature": 0.8, "seed": i}
        body: dict[str, Any] = {"inputs": text, "parameters": p}
    else:
        body = {"max_tokens": n, "stream": stream, "temperature": 0.8 if sampled else 0, **extra}
        if sampled:
            body["seed"] = i
        if route == "/v1/completions":
            body["prompt"] = text
        else:
            body["messages"] = [{"role": "user", "content": text}]
    cut = rng.random() < 0.1
    return Shot(
        route=route,
        body=body,
        stream=stream,
        cut_after=rng.randint(1, 4) if cut and stream else None,
        give_up_s=rng.uniform(0.01, 0.2) if cut and not stream else None,
        invalid=False,
    )


def _invalid(rng: random.Random) -> Shot:
    shots: list[tuple[str, dict[str, Any] | bytes]] = [
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": -1}}),
        ("/generate", {"inputs": "hi \ud800"}),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}),
        ("/v1/chat/completions", {"messages": []}),
        ("/generate_stream", b'{"inputs": "caf\xe9"}'),
        ("/v1/completions", b'{"prompt": "x",'),
    ]
    route, body = rng.choice(shots)
    return Shot(route, body, False, None, None, invalid=True)


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"type": "json", "value": {}}
    for _ in range(depth):
        value = {"a": value}
    return value


def _abuse(rng: random.Random) -> Shot:
    stops = ["".join(rng.choice("xyz") for _ in range(256)) for _ in range(4)]
    long_stops = {"max_new_tokens": 48, "ignore_eos": True, "stop": stops}
    shots: list[tuple[str, dict[str, Any], bool]] = [
        ("/generate_stream", {"inputs": "def add", "parameters": long_stops}, True),
        (
            "/generate",
            {"inputs": "hi", "parameters": {"top_k": 2, "top_n_tokens": 5, "details": True}},
            False,
        ),
        ("/generate", {"inputs": "x " * 1_000_000}, False),  # a 2 MB prompt
        ("/tokenize", {"inputs": "word " * 40_000}, False),
        ("/generate", {"inputs": "hi", "parameters": {"grammar": _nested(900)}}, False),
    ]
    route, body, stream = rng.choice(shots)
    return Shot(route, body, stream, None, None, invalid=False, abuse=True)


@dataclass
class Tally:
    statuses: Counter[int] = field(default_factory=Counter)  # every response that started
    cut_streams: int = 0  # closed by the client mid-stream (their status is counted)
    gave_up: int = 0  # non-streaming clients that timed out (no status)
    invalid_not_4xx: list[str] = field(default_factory=list)
    valid_not_200: list[str] = field(default_factory=list)
    abuse: Counter[int] = field(default_factory=Counter)  # statuses of the abuse requests
    gaps: list[float] = field(default_factory=list)  # ordinary streams' inter-event seconds
    rss: list[int] = field(default_factory=list)  # kB, sampled as requests complete


async def fire(client: httpx.AsyncClient, url: str, shot: Shot, tally: Tally) -> None:
    content = shot.body if isinstance(shot.body, bytes) else json.dumps(shot.body).encode()
    headers = {"content-type": "application/json"}
    try:
        if shot.stream:
            async with client.stream(
                "POST", url + shot.route, content=content, headers=headers
            ) as r:
                status, seen, last = r.status_code, 0, None
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        seen, now = seen + 1, time.perf_counter()
                        if last is not None and not shot.abuse and shot.cut_after is None:
                            tally.gaps.append(now - last)
                        last = now
                    if shot.cut_after is not None and seen >= shot.cut_after:
                        tally.cut_streams += 1
                        break  # the client goes away mid-stream
        else:
            timeout = shot.give_up_s or 120
            r = await client.post(
                url + shot.route, content=content, headers=headers, timeout=timeout
            )
            status = r.status_code
    except httpx.TimeoutException:
        if shot.give_up_s is None:
            raise
        tally.gave_up += 1
        return
    tally.statuses[status] += 1
    if shot.abuse:
        tally.abuse[status] += 1
        if not (status == 200 or 400 <= status < 500):
            tally.valid_not_200.append(f"abuse {shot.route} -> {status}")
        return
    if shot.invalid and not 400 <= status < 500:
        tally.invalid_not_4xx.append(f"{shot.route} {shot.body!r} -> {status}")
    if not shot.invalid and status != 200:
        tally.valid_not_200.append(f"{shot.route} {shot.body!r} -> {status}")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def soak(server: Server, n: int) -> Tally:
    tally = Tally()
    shots: Iterator[int] = iter(range(n))
    every = max(1, n // 100)
    done = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done
        for i in shots:
            await fire(client, server.url, make_shot(i), tally)
            done += 1
            if done % every == 0:
                tally.rss.append(rss_kb(server.proc.pid))

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return tally


def probes(url: str) -> list[str]:
    out = []
    for speculate in (0, 3):
        body = {"inputs": "def add", "parameters": {"max_new_tokens": 24, "speculate": speculate}}
        r = http.post(url + "/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        out.append(r.json()["generated_text"])
    return out


@pytest.fixture(scope="module")
def soak_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    draft = noisy_copy(tiny_model, tmp_path_factory.mktemp("soak-draft"), noise=0.3)
    flags = ["--model", str(tiny_model), "--proposer", "draft", "--draft-model", str(draft)]
    flags += ["--speculate", "3", "--max-total-tokens", "1024", "--kv-cache-bytes", "300kB"]
    flags += ["--max-concurrent-requests", str(4 * CONCURRENCY), "--max-input-tokens", "64"]
    flags += ["--max-body-bytes", "4000000"]  # 2 MB prompts get past the body limit
    log = tmp_path_factory.mktemp("logs") / "soak-server.log"
    server = start_server(flags, log, env={"OMP_NUM_THREADS": "1"})
    yield server
    server.stop()


def test_soak(soak_server: Server) -> None:
    url = soak_server.url
    before = probes(url)
    assert before[0] == before[1]  # speculation on and off agree
    started = time.monotonic()
    tally = asyncio.run(soak(soak_server, REQUESTS))
    seconds = time.monotonic() - started
    after_metrics = idle(url)  # 0 target and draft blocks, nothing in flight
    assert probes(url) == before
    half = tally.rss[len(tally.rss) // 2 :]
    gaps = sorted(tally.gaps)
    rss_spread = round((max(half) - min(half)) / min(half), 4)
    summary = {
        "requests": REQUESTS,
        "abuse": dict(tally.abuse),
        "ordinary_itl_ms_p50_p99": [
            round(1000 * gaps[int(q * (len(gaps) - 1))], 2) for q in (0.5, 0.99)
        ],
        "concurrency": CONCURRENCY,
        "seconds": round(seconds, 1),
        "statuses": dict(tally.statuses),
        "cut_streams": tally.cut_streams,
        "gave_up": tally.gave_up,
        "preemptions": after_metrics.get("specserve_preemptions_total", 0),
        "kv_blocks_used": after_metrics["specserve_kv_cache_blocks_used"],
        "draft_kv_blocks_used": after_metrics["specserve_draft_kv_cache_blocks_used"],
        "rss_kb_first_last": [tally.rss[0], tally.rss[-1]],
        "rss_last_half_spread": rss_spread,
    }
    print("soak:", json.dumps(summary))
    if out := os.environ.get("SPECSERVE_SOAK_OUT"):
        details = {"rss_kb": tally.rss, "odd": tally.invalid_not_4xx + tally.valid_not_200}
        Path(out).write_text(json.dumps(summary | details, indent=2))
    assert not [s for s in tally.statuses if s >= 500], tally.statuses
    assert not tally.invalid_not_4xx, tally.invalid_not_4xx[:5]
    assert not tally.valid_not_200, tally.valid_not_200[:5]
    assert tally.cut_streams > 0 and sum(tally.statuses.values()) + tally.gave_up == REQUESTS
    assert rss_spread <= 0.05, tally.rss
    log = soak_server.log.read_text()
    assert "Traceback" not in log, soak_server.log_tail(60)
    assert scrape(url)["specserve_requests_in_flight"] == 0
