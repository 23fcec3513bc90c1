"""fleet plan: a pool per distinct recommended setting, each applying the profile itself."""

from __future__ import annotations

import json
from pathlib import Path

from specserve.fleet.config import parse_fleet
from specserve.fleet.plan import plan_fleet
from specserve.fleet.routing import Router
from specserve.speculation.profile import make_profile


def entry(n: int, gate: int | None) -> dict[str, object]:
    return {"speculate": n, "speculate_max_batch": gate, "mode": "closed", "best_by_load": {}}


def test_plan_groups_workloads_by_setting(tmp_path: Path) -> None:
    workloads = {
        "code-edit": entry(4, 8),
        "summarize": entry(4, 8),  # same setting: shares code-edit's pool
        "chat-creative": entry(0, None),  # speculation did not pay
        "code-complete": entry(2, None),
    }
    proposer = {"kind": "ngram", "artifact": None}
    profile = make_profile(workloads, {"config_sha256": "a"}, proposer, "cmd", {})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    raw = plan_fleet(path, {"num_threads": 1, "num_cpus": 0.5}, port=9000)
    config = parse_fleet(raw, "planned")  # a file `fleet up` accepts
    assert sorted(config.pools) == ["chat-creative", "code-complete", "code-edit"]
    assert config.default_pool == "code-edit" and config.port == 9000
    code = config.pools["code-edit"]
    assert code.speculation_profile == str(path.resolve())
    assert (code.profile_workload, code.proposer, code.num_cpus) == ("code-edit", "ngram", 0.5)
    assert code.speculate is None  # N and gate come from the profile, checked when loaded
    router = Router.of(config)
    assert router.select_pool("/generate", {"x-specserve-workload": "summarize"}, None) == (
        "code-edit"
    )
    assert router.select_pool("/v1/chat/completions", {}, "chat-creative") == "chat-creative"
    assert router.select_pool("/generate", {"x-specserve-pool": "code-complete"}, None) == (
        "code-complete"
    )
