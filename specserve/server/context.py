"""What every route needs, built once per app and reached through a FastAPI dependency."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from specserve.engine.async_engine import AsyncEngine
from specserve.server.metrics import ServerMetrics
from specserve.server.provenance import Provenance
from specserve.server.service import GenerationService
from specserve.server.settings import Limits, ServerSettings


@dataclass
class ServerContext:
    async_engine: AsyncEngine
    settings: ServerSettings
    limits: Limits
    metrics: ServerMetrics
    service: GenerationService
    special_ids: frozenset[int]
    provenance: Provenance | None = None  # fingerprints and profile review from start-up
    started: int = field(default_factory=lambda: int(time.time()))

    @property
    def tokenizer(self) -> Any:
        return self.async_engine.engine.tokenizer

    def encode(self, text: str) -> list[int]:
        """As the engine encodes a text prompt (no special tokens added)."""
        return self.async_engine.engine.encode(text)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self.async_engine.engine.encode_chat(messages)

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


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def get_ctx(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    return ctx


Ctx = Annotated[ServerContext, Depends(get_ctx)]
