"""Fleet tests: pools of tiny random models, in Ray Serve's local testing mode or on a real
local Ray cluster (tests/fleet/test_cluster.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# Before Ray is imported anywhere: a cluster of this process binds 127.0.0.1 only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

LOOPY = "def add(a, b):\n    return a + b\n\n" * 3  # copy-heavy: the n-gram lookup finds drafts


@pytest.fixture(scope="session")
def fleet_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("fleet-tiny"))


def two_pools(model: Path, **fleet: Any) -> dict[str, Any]:
    """code: n-gram N=4; chat: speculation off (n-gram, so turning it on is live)."""
    engine = {
        "model": str(model),
        "proposer": "ngram",
        "num_threads": 1,
        "num_cpus": 0.25,
        "kv_cache_bytes": 16_000_000,
        "max_input_tokens": 64,
        # the tests count drafts; the adaptive default drafts only where its measured costs say
        # it pays, which a busy machine can deny for a whole request
        "speculation_policy": "static",
    }
    return {
        "default_pool": "chat",
        "pools": {
            "code": {**engine, "speculate": 4, "max_concurrent_requests": 2},
            "chat": {**engine, "speculate": 0},
        },
        "routes": [
            {"header": {"x-specserve-pool": "*"}},
            {"model": "smol-code", "pool": "code"},
            {"path": "/v1/completions", "pool": "code"},
        ],
        **fleet,
    }
