"""httpx's one-shot calls with a timeout a busy machine survives.

httpx's default is 5 s for every call. Beside two CPU-bound processes (the CI machines run other
builds) one compute thread decodes several times slower, and a 64-token request or an `/info`
that waits for a long step can take longer than that. A test that means a short timeout (a
client that gives up on purpose) still passes its own.
"""

from __future__ import annotations

from typing import Any

import httpx

TIMEOUT_S = 120.0


def get(url: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("timeout", TIMEOUT_S)
    return httpx.get(url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("timeout", TIMEOUT_S)
    return httpx.post(url, **kwargs)


def stream(method: str, url: str, **kwargs: Any) -> Any:
    kwargs.setdefault("timeout", TIMEOUT_S)
    return httpx.stream(method, url, **kwargs)
