"""Which pool serves a request: the fleet's route rules, first match wins, then the default.

A rule matches on one thing:
- a header with a value (`{header: {x-tier: batch}, pool: bulk}`), or with `"*"`, meaning the
  header's value names the pool (`{header: {x-specserve-pool: "*"}}`); a name that is not a pool
  is the client's error (`UnknownPool`, a 4xx naming the pools), never a silent fallback;
- the request's model name (OpenAI `model`, TGI `parameters.model`);
- the request path, exactly (`/v1/completions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specserve.fleet.config import FleetConfig, Route


class UnknownPool(ValueError):
    def __init__(self, header: str, name: str, pools: list[str]) -> None:
        super().__init__(f"no pool named {name!r}; the pools are {', '.join(pools)}")
        self.header = header


@dataclass(frozen=True)
class Router:
    routes: tuple[Route, ...]
    default_pool: str
    pools: tuple[str, ...]

    @classmethod
    def of(cls, config: FleetConfig) -> Router:
        return cls(tuple(config.routes), config.default_pool, tuple(sorted(config.pools)))

    def select_pool(self, path: str, headers: Mapping[str, str], model: str | None) -> str:
        """The pool for a request; `headers` with lower-case names. UnknownPool when a header
        that names the pool names none of them."""
        for route in self.routes:
            pool = self._match(route, path, headers, model)
            if pool is not None:
                return pool
        return self.default_pool

    def _match(
        self, route: Route, path: str, headers: Mapping[str, str], model: str | None
    ) -> str | None:
        if route.header is not None:
            [(name, want)] = route.header.items()
            got = headers.get(name.lower())
            if got is None:
                return None
            if want != "*":
                return route.pool if got == want else None
            if got not in self.pools:
                raise UnknownPool(name.lower(), got, list(self.pools))
            return got
        if route.model is not None:
            return route.pool if model == route.model else None
        return route.pool if path == route.path else None
