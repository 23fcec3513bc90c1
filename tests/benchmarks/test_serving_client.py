"""The serving benchmark's stream reader: events parsed after the reply, stamped by their read."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from benchmarks.serving_client import over_http, sse_tokens

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(payload: object) -> bytes:
    event = b"data:" + json.dumps(payload).encode() + b"\n\n"
    return f"{len(event):x}\r\n".encode() + event + b"\r\n"


def token(token_id: int) -> bytes:
    return chunk({"token": {"id": token_id}})


def test_each_token_gets_the_time_of_the_read_that_completed_its_chunk() -> None:
    one, two, three = token(7), token(8), token(9)
    reads = [
        (1.0, HEAD + one[:10]),  # the first event, cut in its middle
        (2.0, one[10:] + two),  # ...completed here, with all of the second
        (3.0, three[:-2]),  # the third's data, but not its chunk's CRLF
        (4.0, three[-2:] + b"0\r\n\r\n"),
    ]
    assert sse_tokens(reads) == ([2.0, 2.0, 3.0], [7, 8, 9])


def test_an_event_split_over_two_chunks_is_stamped_by_the_second() -> None:
    event = b'data:{"token": {"id": 5}}\n\n'
    first, second = event[:12], event[12:]
    reads = [
        (1.0, HEAD + f"{len(first):x}\r\n".encode() + first + b"\r\n"),
        (2.0, f"{len(second):x}\r\n".encode() + second + b"\r\n0\r\n\r\n"),
    ]
    assert sse_tokens(reads) == ([2.0], [5])


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"HTTP/1.1 422 Unprocessable\r\ncontent-length: 0\r\n\r\n", "answered"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", "chunked"),
        (HEAD + token(1) + chunk({"error": "boom"}) + b"0\r\n\r\n", "boom"),
    ],
)
def test_a_failed_reply_raises(reply: bytes, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        sse_tokens([(1.0, reply)])


def serve_streams(listener: socket.socket, n: int) -> None:
    """Accept n requests, then answer them interleaved, event by event: request i's reply is
    the token ids of the bytes of its text."""
    conns, texts = [], []
    for _ in range(n):
        conn, _ = listener.accept()
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        head, _, body = head.partition(b"\r\n\r\n")
        size = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < size:
            body += conn.recv(4096)
        conns.append(conn)
        texts.append(json.loads(body)["inputs"].encode())
    for conn in conns:
        conn.sendall(HEAD)
    for i in range(max(map(len, texts))):
        for conn, text in zip(conns, texts, strict=True):
            if i < len(text):
                conn.sendall(token(text[i]))
    for conn in conns:
        conn.sendall(b"0\r\n\r\n")
        conn.close()


@pytest.mark.parametrize("batch", [["hello", "streams", "ab"], ["one stream alone"]])
def test_streams_read_at_once_each_get_their_own_tokens(batch: list[str]) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = threading.Thread(target=serve_streams, args=(listener, len(batch)))
    server.start()
    try:
        wall, cpu, runs, ids = over_http(f"http://127.0.0.1:{port}", batch, stream=True)
    finally:
        server.join(timeout=10)
        listener.close()
    assert ids == {text: list(text.encode()) for text in batch}
    for (sent, stamps), text in zip(runs, batch, strict=True):
        assert len(stamps) == len(text)
        assert sent <= stamps[0] and stamps == sorted(stamps)
    assert wall > 0 and cpu is not None
