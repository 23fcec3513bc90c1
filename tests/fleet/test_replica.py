"""A pool replica started as `serve` starts its engine, taking every live-marked setting live."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import fields
from pathlib import Path
from typing import Any

from specserve.cli_args import engine_config
from specserve.config import CacheConfig, EngineConfig, SchedulerConfig, SpecConfig
from specserve.config_schema import FLAG
from specserve.fleet.config import (
    live_settings,
    parse_fleet,
    pool_values,
    with_changes,
)
from specserve.fleet.flags import LIVE_FIELDS, with_defaults
from specserve.fleet.replica import PoolReplica
from tests.fleet.conftest import two_pools

# A new value for every live field (a field marked live in the schema must be listed here).
NEW_VALUES: dict[str, Any] = {
    "speculate": 2,
    "proposer": "suffix",
    "speculation_policy": "adaptive",  # the test pools run static (tests/fleet/conftest.py)
    "speculate_max_batch": 3,
    "speculate_max_tokens": 64,
    "ngram_max": 2,
    "suffix_cache_tokens": 1000,
}


def test_live_fields_are_the_fields_the_schema_marks_live() -> None:
    records = (EngineConfig, SpecConfig, CacheConfig, SchedulerConfig)
    flags = [f.metadata[FLAG] for cls in records for f in fields(cls) if FLAG in f.metadata]
    marked = {f.name.removeprefix("--").replace("-", "_") for f in flags if f.live}
    assert set(LIVE_FIELDS) == marked == set(NEW_VALUES)


def test_a_replica_takes_every_live_field_in_place(fleet_model: Path) -> None:
    config = parse_fleet(two_pools(fleet_model), "test")
    pool = config.pools["code"]
    fixed = {k: v for k, v in pool_values(pool).items() if k not in LIVE_FIELDS}

    async def run() -> None:
        replica = PoolReplica("code", fixed)
        gc.unfreeze()
        await replica.reconfigure(live_settings(pool))
        try:
            assert gc.get_freeze_count() > 0  # the start-up heap frozen, as `serve` does
            for name, value in NEW_VALUES.items():
                live = live_settings(with_changes(config, "code", {name: value}).pools["code"])
                await replica.reconfigure(live)
                want = engine_config(with_defaults({**fixed, **live})).spec
                assert want != engine_config(with_defaults(pool_values(pool))).spec, name
                assert replica.config.spec == want, name
                assert replica.engine.engine.config.spec == want, name
                assert (await replica.state()).live[name] == value, name
        finally:
            gc.unfreeze()  # back to how the test process had it
            await replica.engine.shutdown(timeout=5.0)

    asyncio.run(run())
