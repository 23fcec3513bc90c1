"""bench_llamacpp's batch-1 clients: one streamed request to llama-server (`/completion`, token
ids in and out) or to specserve (`/generate_stream`, the text that encodes to the same ids),
greedy, EOS ignored, NEW_TOKENS new tokens; each token stamped when its event arrives."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx

NEW_TOKENS = 128


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            yield json.loads(line[5:])


def stream_llamacpp(
    client: httpx.Client, url: str, ids: list[int]
) -> tuple[float, list[float], list[int]]:
    body = {
        "prompt": ids,
        "n_predict": NEW_TOKENS,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": True,
        "return_tokens": True,
        "samplers": ["top_k"],
        "top_k": 1,
        "temperature": 0.0,
    }
    stamps: list[float] = []
    tokens: list[int] = []
    started = time.perf_counter()
    # One connection per request: this llama-server build shuts down when a kept-alive
    # connection sends a second request. An event's `tokens` can leave out tokens whose text
    # it holds back (incomplete UTF-8); `tokens_predicted` counts them all, for the timing.
    headers = {"Connection": "close"}
    with client.stream("POST", f"{url}/completion", json=body, headers=headers) as r:
        r.raise_for_status()
        for event in sse_events(r):
            if "tokens_predicted" in event:
                stamps += [time.perf_counter()] * (event["tokens_predicted"] - len(stamps))
            tokens += event.get("tokens") or []
    return started, stamps, tokens


def stream_specserve(
    client: httpx.Client, url: str, text: str
) -> tuple[float, list[float], list[int]]:
    body = {"inputs": text, "parameters": {"max_new_tokens": NEW_TOKENS, "ignore_eos": True}}
    stamps: list[float] = []
    tokens: list[int] = []
    started = time.perf_counter()
    with client.stream("POST", f"{url}/generate_stream", json=body) as r:
        r.raise_for_status()
        for event in sse_events(r):
            if "error" in event:
                raise RuntimeError(f"specserve: {event['error']}")
            stamps.append(time.perf_counter())
            tokens.append(event["token"]["id"])
    return started, stamps, tokens
