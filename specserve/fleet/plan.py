"""`specserve fleet plan`: the bench's speculation profile -> a fleet config.

One pool per distinct setting the profile recommends: workloads that want the same (N, gate)
share a pool, named after the first of them; a workload whose speculation did not pay gets a
pool with it off. Each pool applies the profile itself (`speculation_profile` +
`profile_workload`), so its replicas check the profile's fingerprints against what they load
and report a stale setting after a checkpoint change, as `serve --speculation-profile` does.

Requests reach a workload's pool by the header `x-specserve-workload: NAME` or by the model
name NAME (OpenAI `model`, TGI `parameters.model`); `x-specserve-pool` names a pool directly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from specserve.fleet.config import POOL_HEADER
from specserve.speculation.profile import load_profile, profile_setting
from specserve.speculation.registry import REGISTRY

WORKLOAD_HEADER = "x-specserve-workload"


def plan_fleet(
    profile_path: str | Path, engine: dict[str, Any] | None = None, **fleet: Any
) -> dict[str, Any]:
    """The fleet config (as a YAML-ready dict). `engine`: flags every pool gets (model,
    num_threads, num_cpus, ...); `fleet`: fleet-wide fields (host, port, ...)."""
    path = Path(profile_path).resolve()
    profile = load_profile(path)
    kind = (profile.get("proposer") or {}).get("kind") or REGISTRY.fallback
    pools: dict[str, dict[str, Any]] = {}
    by_setting: dict[tuple[int, int | None], str] = {}
    pool_of: dict[str, str] = {}
    for workload in profile["workloads"]:
        setting = profile_setting(profile, workload)
        name = by_setting.get(setting)
        if name is None:
            name = by_setting[setting] = _pool_name(workload, pools)
            pools[name] = {
                **(engine or {}),
                "speculation_profile": str(path),
                "profile_workload": workload,
                "proposer": kind if setting[0] else REGISTRY.fallback,  # off: load nothing
            }
        pool_of[workload] = name
    default = pool_of[profile.get("default_workload") or next(iter(profile["workloads"]))]
    routes: list[dict[str, Any]] = [{"header": {POOL_HEADER: "*"}}]
    routes += [{"header": {WORKLOAD_HEADER: w}, "pool": p} for w, p in pool_of.items()]
    routes += [{"model": w, "pool": p} for w, p in pool_of.items()]
    return {**fleet, "default_pool": default, "pools": pools, "routes": routes}


def _pool_name(workload: str, taken: dict[str, Any]) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", workload).strip("-") or "pool"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name
