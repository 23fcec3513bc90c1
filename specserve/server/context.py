"""What every route needs, built once per app and reached through a FastAPI dependency.

An app serves one `ServerContext` (`serve`) or picks one per request (a fleet ingress picks the
pool's): `Contexts` is that choice, `get_ctx` the dependency the routes declare.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request

from specserve.engine.async_engine import AsyncEngine
from specserve.outputs import RequestOutput
from specserve.server.backend import Backend, LocalBackend
from specserve.server.direct import DirectWriter, writer
from specserve.server.metrics import ServerMetrics
from specserve.server.outcome import Outcome
from specserve.server.provenance import Provenance
from specserve.server.service import GenerationService
from specserve.server.settings import Limits, ServerSettings
from specserve.server.tracked import Tracked


@dataclass
class ServerContext:
    backend: Backend
    settings: ServerSettings
    limits: Limits
    metrics: ServerMetrics
    service: GenerationService
    special_ids: frozenset[int]
    provenance: Provenance | None = None  # fingerprints and profile review from start-up
    started: int = field(default_factory=lambda: int(time.time()))

    @property
    def async_engine(self) -> AsyncEngine:
        """The engine in this process (`serve`); a fleet ingress's pools have none."""
        if not isinstance(self.backend, LocalBackend):
            raise TypeError("this context's engine runs elsewhere (a fleet pool)")
        return self.backend.async_engine

    @property
    def tokenizer(self) -> Any:
        return self.backend.tokenizer

    @property
    def prompt_tokenizer(self) -> Any:
        """The tokenizer to encode prompts with off the event loop: the backend's own copy where
        it has one (`serve`), else its tokenizer (a fleet ingress's, which no engine shares)."""
        return getattr(self.backend, "prompt_tokenizer", self.tokenizer)

    def encode(self, text: str) -> list[int]:
        """As the engine encodes a text prompt (no special tokens added)."""
        return self.backend.encode(text)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self.backend.encode_chat(messages)

    def direct_writer(
        self, request: Request, tracked: Tracked, events: Callable[[RequestOutput], str]
    ) -> DirectWriter | None:
        """A writer of the request's stream on the engine's thread (`server/direct.py`), where
        its connection allows one: `events` formats an output, the service records it."""
        observe = partial(self.service.observe, tracked, 0)
        return writer(request, events, observe, self.metrics.direct_writes.inc)

    def token_texts(self, ids: list[int], text: str) -> list[str]:
        """Split one output delta's text over its tokens. Each token's own decoding is used when
        those pieces add up to the delta's text; otherwise (merged characters, text held back
        for a stop string) the last token carries it all. The pieces always join to `text`."""
        if len(ids) <= 1:
            return [text] * len(ids)
        pieces = [self.tokenizer.decode([t], skip_special_tokens=True) for t in ids]
        if "".join(pieces) == text:
            return pieces
        return [""] * (len(ids) - 1) + [text]


class Contexts(Protocol):
    """Which context serves a request, and where a request that fails before it has one (bad
    JSON, 401, 413) is counted."""

    async def pick(self, request: Request) -> ServerContext: ...

    def count(self, path: str, headers: dict[str, str], outcome: Outcome, chosen: Any) -> None:
        """`chosen`: what `pick` left in `request.state.chosen` (None: it did not run)."""
        ...


@dataclass(frozen=True)
class OneContext:
    """`serve`: every request gets the one engine's context."""

    ctx: ServerContext

    async def pick(self, request: Request) -> ServerContext:
        return self.ctx

    def count(self, path: str, headers: dict[str, str], outcome: Outcome, chosen: Any) -> None:
        self.ctx.metrics.count(route_label(path), outcome)


# Label values for request counts; anything else is "other" (bounded cardinality).
GENERATION_ROUTES = frozenset(
    {
        "/",
        "/generate",
        "/generate_stream",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
    }
)


def route_label(path: str) -> str:
    return path if path in GENERATION_ROUTES else "other"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def get_ctx(request: Request) -> ServerContext:
    contexts: Contexts = request.app.state.contexts
    return await contexts.pick(request)


Ctx = Annotated[ServerContext, Depends(get_ctx)]
