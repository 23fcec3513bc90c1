"""The engine thread's writer of streamed events (server/direct.py).

On a socket pair: chunks framed as HTTP/1.1 does, nothing written before it is armed or while
the loop's transport still buffers bytes, a short write handing the rest to the loop, a closed
peer raising. Over HTTP: every streaming route sends the same events as a server whose loop
writes them (`--stream-from-loop`), with speculation on (several tokens an output).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from specserve.outputs import RequestOutput
from specserve.server.direct import Connection, DirectWriter
from tests.server.conftest import (
    TINY_FLAGS,
    Server,
    floored_env,
    idle,
    scrape,
    sse_events,
    start_server,
)


@dataclass
class FakeTransport:
    buffered: int = 0
    closing: bool = False
    written: list[bytes] = field(default_factory=list)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.written.append(data)


@dataclass
class FakeCycle:
    chunked_encoding: bool | None = True
    response_complete: bool = False


class FakeLoop:
    def __init__(self) -> None:
        self.calls: list[Callable[[], Any]] = []

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        self.calls.append(lambda: fn(*args))

    def run(self) -> None:
        for call in self.calls:
            call()
        self.calls.clear()


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    yield ours, peer
    ours.close()
    peer.close()


def out(n: int) -> RequestOutput:
    return RequestOutput("r", [n], f"t{n}", False, None, 3, n)


def make(
    ours: socket.socket,
    events: Callable[[RequestOutput], str] = lambda o: f"data: {o.new_text}\n\n",
) -> tuple[DirectWriter, FakeTransport, FakeCycle, FakeLoop, list[RequestOutput]]:
    transport, cycle, loop = FakeTransport(), FakeCycle(), FakeLoop()
    observed: list[RequestOutput] = []
    conn = Connection(loop, transport, cycle, ours.fileno())  # type: ignore[arg-type]
    return (
        DirectWriter(conn, events, observed.append, lambda: None),
        transport,
        cycle,
        loop,
        observed,
    )


def chunk(text: str) -> bytes:
    data = text.encode()
    return b"%x\r\n%b\r\n" % (len(data), data)


def read_all(peer: socket.socket) -> bytes:
    peer.setblocking(False)
    got = b""
    while True:
        try:
            part = peer.recv(1 << 16)
        except BlockingIOError:
            return got
        if not part:
            return got
        got += part


def test_writes_one_chunk_per_output_once_armed(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, peer = pair
    writer, transport, _, _, observed = make(ours)
    assert not writer(out(1))  # not armed: the loop writes it
    writer.arm()
    assert writer(out(2)) and writer(out(3))
    assert read_all(peer) == chunk("data: t2\n\n") + chunk("data: t3\n\n")
    assert [o.new_text for o in observed] == ["t2", "t3"]
    transport.buffered = 10  # the loop's last write is not all out yet
    assert not writer(out(4))
    transport.buffered = 0
    writer.close()
    assert not writer(out(5))  # closed: everything goes through the loop again
    assert read_all(peer) == b"" and len(observed) == 2


def test_an_output_without_events_is_taken_and_writes_nothing(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, peer = pair
    writer, *_ = make(ours, events=lambda o: "")
    writer.arm()
    assert writer(out(1))
    assert read_all(peer) == b""


@pytest.mark.parametrize(
    "state", [{"chunked_encoding": False}, {"response_complete": True}, {"closing": True}]
)
def test_not_armed_unless_a_chunked_response_is_open(
    pair: tuple[socket.socket, socket.socket], state: dict[str, Any]
) -> None:
    ours, _ = pair
    writer, transport, cycle, _, _ = make(ours)
    for name, value in state.items():
        setattr(transport if name == "closing" else cycle, name, value)
    writer.arm()
    assert not writer(out(1))


def test_a_short_write_hands_the_rest_and_the_stream_to_the_loop(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, peer = pair
    big = "x" * 50_000  # more than the socket pair buffers
    writer, transport, _, loop, _ = make(ours, events=lambda o: big)
    writer.arm()
    assert writer(out(1))
    assert not writer(out(2))  # given back: the loop writes from now on
    got = read_all(peer)
    assert 0 < len(got) < len(chunk(big)) and not transport.written
    loop.run()
    assert got + b"".join(transport.written) == chunk(big)


def test_a_write_to_a_closed_peer_raises(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, peer = pair
    writer, *_ = make(ours)
    writer.arm()
    peer.close()
    with pytest.raises(OSError):
        for i in range(3):  # the first write after a close may still succeed
            writer(out(i))
    assert not writer(out(9))


def test_the_writer_owns_a_duplicate_of_the_descriptor(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """Closing the connection's own descriptor (uvicorn closing the transport) never makes a
    write land on another socket that reused its number: the writer writes on its duplicate."""
    ours, peer = pair
    writer, *_ = make(ours)
    writer.arm()
    fd = ours.detach()
    os.close(fd)
    other, other_peer = socket.socketpair()  # likely reuses the number
    try:
        assert writer(out(1))
        assert read_all(peer) == chunk("data: t1\n\n")
        assert read_all(other_peer) == b""
    finally:
        writer.close()
        other.close()
        other_peer.close()


# Outputs go to the engine thread's writer only when the compute threads take every core.
# Static drafts: the two servers' streams are compared logprob for logprob, and this dense
# float32 model's GEMMs round a row by its step's shape (only the block kernels are batch-
# invariant), which the adaptive policy would choose from each server's own step timings.
EVERY_CORE = ["--num-threads", str(len(os.sched_getaffinity(0))), "--speculation-policy", "static"]


@pytest.fixture(scope="module")
def direct_server(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`tiny_server`'s flags, compute on every core, steps floored (`long_server`'s)."""
    log = tmp_path_factory.mktemp("logs") / "direct-server.log"
    flags = ["--model", str(tiny_model), *TINY_FLAGS, *EVERY_CORE]
    server = start_server(flags, log, env=floored_env())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def loop_server(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`direct_server` with its event loop writing every streamed event."""
    log = tmp_path_factory.mktemp("logs") / "loop-server.log"
    flags = ["--model", str(tiny_model), *TINY_FLAGS, *EVERY_CORE, "--stream-from-loop"]
    server = start_server(flags, log)
    yield server
    server.stop()


SPEC = {"max_new_tokens": 48, "ignore_eos": True, "decoder_input_details": False}
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"  # copies: drafts accepted
ROUTES: dict[str, dict[str, Any]] = {
    "/generate_stream": {"inputs": PROMPT, "parameters": {**SPEC, "details": True}},
    "/v1/completions": {
        "prompt": PROMPT, "max_tokens": 48, "ignore_eos": True, "stream": True, "logprobs": 2,
        "temperature": 0,
    },
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 48,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    },
}  # fmt: skip
# Differ from request to request on any server, or follow the adaptive policy's history.
VOLATILE = {"id", "created", "drafted_tokens", "accepted_tokens", "speculation_steps"}
VOLATILE |= {"completion_tokens_details"}


def stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def events(url: str, route: str) -> list[Any]:
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", url + route, json=ROUTES[route]) as r,
    ):
        assert r.status_code == 200, r.read()
        return [stable(e) for e in sse_events(r.iter_lines())]


def merged(route: str, evs: list[Any]) -> Any:
    """What a client reads from an OpenAI stream: how the text is cut into chunks follows how
    many drafts each step accepted, which the adaptive policy's history decides."""
    if route == "/generate_stream":
        return evs  # one event per token
    text, lps, rest = "", [], []
    for e in evs:
        for c in e["choices"]:
            delta = c.get("delta") or {}
            text += c.get("text") or delta.get("content") or ""
            lp = c.get("logprobs") or {}
            lps += list(zip(lp.get("tokens", []), lp.get("token_logprobs", []), strict=True))
            if c.get("finish_reason") or delta.get("role"):
                rest.append(c)
        if e.get("usage"):
            rest.append(e["usage"])
    return text, lps, rest


def direct_writes(url: str) -> float:
    return direct_writes_of(scrape(url))


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_stream_sends_what_the_loop_would(
    direct_server: Server, loop_server: Server, route: str
) -> None:
    before, loop_before = direct_writes(direct_server.url), direct_writes(loop_server.url)
    direct = events(direct_server.url, route)
    written = direct_writes(direct_server.url) - before
    assert merged(route, direct) == merged(route, events(loop_server.url, route))
    assert written >= 1  # outputs went out from the engine's thread
    assert direct_writes(loop_server.url) == loop_before == 0
    stats = scrape(direct_server.url)
    assert stats['specserve_spec_accepted_tokens_total{proposer="ngram"}'] > 0


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_client_leaving_a_stream_the_engine_writes_aborts_it(
    direct_server: Server, route: str
) -> None:
    """The client closes its socket while the engine's thread is writing to it: the request
    is aborted (counted cancelled) and every KV block freed, without waiting for its tokens."""
    body = {**ROUTES[route]}
    if route == "/generate_stream":
        body["parameters"] = {**body["parameters"], "max_new_tokens": 3000}
    else:
        body["max_tokens"] = 3000
    before = idle(direct_server.url)
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", direct_server.url + route, json=body) as r,
    ):
        stream = sse_events(r.iter_lines())
        for i, _ in enumerate(stream):  # until the engine's thread has written some
            if i % 10 == 9 and direct_writes(direct_server.url) > direct_writes_of(before):
                break
        else:
            raise AssertionError("the stream ended with no event written by the engine")
    after = idle(direct_server.url)  # blocks back to 0 (3000 floored steps would take 15 s)
    cancelled = f'specserve_requests_total{{outcome="cancelled",route="{route}"}}'
    assert after.get(cancelled, 0) - before.get(cancelled, 0) == 1


def direct_writes_of(samples: dict[str, float]) -> float:
    return samples["specserve_stream_direct_writes_total"]
