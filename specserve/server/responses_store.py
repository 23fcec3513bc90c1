"""Stored responses (`store: true`), for `previous_response_id` and GET /v1/responses/{id}.

In memory and bounded: each tenant (API key; one namespace without tenants) keeps its most
recently stored or used `per_tenant` responses, the least recently used going first. A lookup
under another tenant finds nothing, the same answer as for an id never stored, so one tenant can
neither read another's responses nor learn that an id exists. Nothing survives a restart.
Thread-safe: a streamed response is stored from the engine's thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from specserve.server.responses_schemas import ResponseObject

MAX_STORED_PER_TENANT = 256


@dataclass(frozen=True)
class Stored:
    response: ResponseObject
    messages: list[dict[str, Any]]  # the conversation so far in chat form, instructions left out


class ResponseStore:
    def __init__(self, per_tenant: int = MAX_STORED_PER_TENANT) -> None:
        if per_tenant < 1:
            raise ValueError(f"per_tenant must be >= 1; got {per_tenant}")
        self.per_tenant = per_tenant
        self._lock = threading.Lock()
        self._tenants: dict[str | None, OrderedDict[str, Stored]] = {}

    def put(self, tenant: str | None, stored: Stored) -> None:
        with self._lock:
            entries = self._tenants.setdefault(tenant, OrderedDict())
            entries[stored.response.id] = stored
            entries.move_to_end(stored.response.id)
            while len(entries) > self.per_tenant:
                entries.popitem(last=False)

    def get(self, tenant: str | None, response_id: str) -> Stored | None:
        with self._lock:
            entries = self._tenants.get(tenant)
            found = None if entries is None else entries.get(response_id)
            if found is not None and entries is not None:
                entries.move_to_end(response_id)
            return found

    def delete(self, tenant: str | None, response_id: str) -> bool:
        with self._lock:
            entries = self._tenants.get(tenant)
            return entries is not None and entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return sum(len(e) for e in self._tenants.values())
