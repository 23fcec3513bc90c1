"""bench_serving's load generator: one wave of requests sent at once to a server, each
token stamped with the time it arrived.

It shares the machine with the server, so it spends as little CPU per token as it can (see
`_stream`). Every request is greedy (no `do_sample`: TGI's default), EOS ignored, NEW_TOKENS
new tokens.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import selectors
import socket
import time
from typing import Any

import httpx

NEW_TOKENS = 128

# wall seconds, the load generator's CPU seconds (None in process), per request
# (send time, token stamps), and each prompt's token ids
Run = tuple[float, float | None, list[tuple[float, list[float]]], dict[str, list[int]]]


async def _one(client: httpx.AsyncClient, url: str, text: str) -> Any:
    """One non-streaming request: the token ids arrive, all at once, with the reply."""
    body = {
        "inputs": text,
        "parameters": {"max_new_tokens": NEW_TOKENS, "ignore_eos": True, "details": True},
    }
    sent = time.perf_counter()
    r = await client.post(url + "/generate", json=body)
    r.raise_for_status()
    done = time.perf_counter()
    ids = [t["id"] for t in r.json()["details"]["tokens"]]
    return text, sent, [done] * len(ids), ids


def _request(host: str, text: str) -> bytes:
    body = {"inputs": text, "parameters": {"max_new_tokens": NEW_TOKENS, "ignore_eos": True}}
    payload = json.dumps(body).encode()
    head = (
        f"POST /generate_stream HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


def _stream(url: str, batch: list[str]) -> list[Any]:
    """POST /generate_stream for every text at once, each over its own socket, all read from
    this one thread: stamp each read, parse after the replies end.

    The load generator's CPU comes out of the cores the server computes on, and at batch 1 it
    runs beside every step: httpx's streaming cost ~1 ms an event on this machine, a hand-written
    reader on an asyncio stream ~0.34 ms, the same reader on a blocking socket ~0.21 ms (ad hoc,
    `time.process_time`). Here the work per event is one `recv` and one clock read (~0.09 ms,
    most of it the kernel's loopback work); events are parsed once the replies have ended, each
    stamped with the time of the read that completed it. One `select` takes every socket that
    has bytes, so a server step's events for 16 requests cost one wake-up of one thread, where a
    thread per request (the reader before) woke 16 threads that passed the GIL from one to the
    next: 0.03 against 0.06 ms of CPU per token at 16 at once (ad hoc). The last socket open
    (all of batch 1) is read without a select before each read. The server cannot tell
    the difference: the same requests, the same bytes back."""
    host, port = url.removeprefix("http://").split(":")
    reads: list[list[tuple[float, bytes]]] = [[] for _ in batch]
    sent: list[float] = []
    socks = []
    with selectors.DefaultSelector() as sel:
        try:
            for i, text in enumerate(batch):
                sock = socket.create_connection((host, int(port)))
                socks.append(sock)
                sent.append(time.perf_counter())
                sock.sendall(_request(host, text))
                sel.register(sock, selectors.EVENT_READ, (i, sock))
            while len(sel.get_map()) > 1:
                for key, _ in sel.select():
                    i, sock = key.data
                    if data := sock.recv(1 << 16):
                        reads[i].append((time.perf_counter(), data))
                    else:
                        sel.unregister(sock)
            for key in list(sel.get_map().values()):  # the last one: no select before each read
                i, sock = key.data
                while data := sock.recv(1 << 16):
                    reads[i].append((time.perf_counter(), data))
        finally:
            for sock in socks:
                sock.close()
    return [(text, sent[i], *sse_tokens(reads[i])) for i, text in enumerate(batch)]


def sse_tokens(reads: list[tuple[float, bytes]]) -> tuple[list[float], list[int]]:
    """The token events of a chunked SSE reply read as (time, bytes) pieces: per token, the time
    of the read that held the last byte of its event's chunk, and its id."""
    raw = b"".join(data for _, data in reads)
    ends = list(itertools.accumulate(len(data) for _, data in reads))
    head, _, _ = raw.partition(b"\r\n\r\n")
    status, _, headers = head.partition(b"\r\n")
    if b" 200 " not in status:
        raise RuntimeError(f"/generate_stream answered {status!r}")
    if b"transfer-encoding: chunked" not in headers.lower():
        raise RuntimeError("expected a chunked SSE reply")
    stamps: list[float] = []
    ids: list[int] = []
    pos, pending = len(head) + 4, b""
    while size := int(raw[pos : (eol := raw.index(b"\r\n", pos))], 16):
        pending += raw[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2
        arrived = reads[bisect.bisect_right(ends, eol + 1 + size)][0]
        *events, pending = pending.split(b"\n\n")
        for line in (ln for ev in events for ln in ev.split(b"\n")):
            if line.startswith(b"data:"):
                event = json.loads(line[5:])
                if "error" in event:
                    raise RuntimeError(event["error"])
                stamps.append(arrived)
                ids.append(event["token"]["id"])
    return stamps, ids


async def _non_streaming(url: str, batch: list[str]) -> tuple[float, float, list[Any]]:
    limits = httpx.Limits(max_connections=len(batch) + 2)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        started, cpu = time.perf_counter(), time.process_time()
        done = await asyncio.gather(*(_one(client, url, t) for t in batch))
        return time.perf_counter() - started, time.process_time() - cpu, done


def over_http(url: str, batch: list[str], stream: bool) -> Run:
    """One wave: `batch` sent at once to the server. The wall and CPU times leave out setting
    up the non-streaming client (httpx's takes ~50 ms of CPU)."""
    if stream:
        started, cpu = time.perf_counter(), time.process_time()
        done = _stream(url, batch)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    else:
        wall, cpu, done = asyncio.run(_non_streaming(url, batch))
    runs = [(sent, stamps) for _, sent, stamps, _ in done]
    return wall, cpu, runs, {t: ids for t, _, _, ids in done}
