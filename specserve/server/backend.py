"""The seam between the HTTP routes and whoever runs the engine.

`serve` runs the engine in this process (`LocalBackend` over the `AsyncEngine`); a fleet's
ingress sends each request to a pool's replicas over Ray Serve (`specserve/fleet/ingress.py`).
The routes, the validation and the admission code are the same for both: they only call these
methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from specserve.engine.async_engine import AsyncEngine
from specserve.engine.handover import Sink
from specserve.engine.prompt import encode_messages, encode_text
from specserve.outputs import RequestOutput
from specserve.request import SamplingParams


class Backend(Protocol):
    """Runs prepared requests. `generate` streams one request's outputs; it raises ValueError
    (before any output) when the engine refuses the request and RuntimeError when the engine
    cannot take it now (shutting down, replica gone). Leaving the iterator early aborts the
    request and frees its KV blocks."""

    @property
    def tokenizer(self) -> Any: ...

    def encode(self, text: str) -> list[int]:
        """As the engine encodes a text prompt (no special tokens added)."""
        ...

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]: ...

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        after: str | None = None,
        stream: bool = True,
        sink: Sink | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """`after`: an earlier choice of the same request (same prompt), whose cached prompt
        this one may wait for and reuse; a backend may ignore it. `stream=False`: the caller
        needs only the first output with tokens and the last (which then carries every token
        after the first output); a backend may still send every output. `sink`: may take
        outputs where the engine runs (see `AsyncEngine.generate`); a backend may ignore it."""
        ...

    @property
    def alive(self) -> bool:
        """False once the engine behind it has died: refuse requests fast, /health 503."""
        ...

    @property
    def died(self) -> str | None:
        """Why it died, if it did."""
        ...

    def abort_all(self, error: str) -> None:
        """End every request in flight now (a drain past its timeout)."""
        ...


@dataclass(frozen=True)
class LocalBackend:
    """The engine in this process, stepped by the AsyncEngine's thread. Prompts are encoded
    (in the routes' worker threads) by `prompt_tokenizer`, a copy of the engine's with its own
    lock, so that a long prompt never holds the lock the engine's detokenizer takes."""

    async_engine: AsyncEngine
    prompt_tokenizer: Any

    @property
    def tokenizer(self) -> Any:
        return self.async_engine.engine.tokenizer

    def encode(self, text: str) -> list[int]:
        return encode_text(self.prompt_tokenizer, text)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return encode_messages(self.prompt_tokenizer, messages)

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        after: str | None = None,
        stream: bool = True,
        sink: Sink | None = None,
    ) -> AsyncIterator[RequestOutput]:
        return self.async_engine.generate(prompt_ids, params, request_id, after, stream, sink)

    @property
    def alive(self) -> bool:
        return self.async_engine.alive

    @property
    def died(self) -> str | None:
        return self.async_engine.died

    def abort_all(self, error: str) -> None:
        self.async_engine.abort_all(error)
