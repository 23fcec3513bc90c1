"""A fleet's /metrics and /info: every pool's series under a `pool` label, every replica listed.

Each pool keeps `serve`'s own `ServerMetrics` (request series observed at the ingress, engine
series read from each replica's last reported state, labelled `replica`); the exposition merges
them, family by family, adding `pool` to every sample. So every series `serve` exports is here,
with the same name and meaning, once per pool (and per replica for the engine's).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field

from specserve import __version__
from specserve.server.info_schemas import Info


def render_pools(registries: dict[str, CollectorRegistry]) -> bytes:
    """One exposition of every pool's registry, each sample labelled with its pool."""
    merged: dict[str, Metric] = {}
    for pool, registry in registries.items():
        for family in registry.collect():
            out = merged.get(family.name)
            if out is None:
                out = Metric(family.name, family.documentation, family.type, family.unit)
                merged[family.name] = out
            for s in family.samples:
                out.samples.append(s._replace(labels={"pool": pool, **s.labels}))
    registry = CollectorRegistry()
    registry.register(_Fixed(list(merged.values())))
    return generate_latest(registry)


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


class ReplicaInfo(BaseModel):
    replica: str = Field(..., description="Ray Serve's replica id")
    pid: int
    node: str
    started: float = Field(..., description="unix time the engine was up")
    live: dict[str, Any] = Field(..., description="the speculation settings it runs now")


class PoolInfo(BaseModel):
    settings: dict[str, Any] = Field(..., description="the pool's live settings as deployed")
    version: str = Field(..., description="deployment version: changes restart the replicas")
    replicas: list[ReplicaInfo]
    unreachable: list[str] = Field(
        default_factory=list, description="replicas that did not answer (dying or starting)"
    )
    engine: Info | None = Field(
        default=None, description="one replica's /info: model, speculation, fingerprints"
    )
    profile_stale: bool | None = Field(
        default=None, description="the applied speculation profile no longer matches; None: none"
    )


class FleetInfo(BaseModel):
    router: str = "specserve-fleet"
    version: str = __version__
    default_pool: str
    routes: list[dict[str, Any]]
    pools: dict[str, PoolInfo]
