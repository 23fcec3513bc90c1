"""Fleet config validation: errors name the file, pool and field; pools are serve's flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from specserve.cli import build_parser
from specserve.fleet.config import (
    FleetConfigError,
    PoolConfig,
    live_settings,
    load_fleet,
    parse_fleet,
    read_fleet,
    restart_key,
    with_changes,
)
from specserve.fleet.flags import LIVE_FIELDS, POOL_SERVE_FLAGS
from tests.fleet.conftest import two_pools

GOOD = """
default_pool: chat
pools:
  code: {speculate: 4, proposer: ngram, speculation_policy: adaptive, speculate_max_batch: 8,
         replicas: 2, num_cpus: 0.5, num_threads: 1}
  chat: {speculate: 2, proposer: medusa}
  bulk: {speculate: 0, autoscaling: {min_replicas: 1, max_replicas: 3}}
routes:
  - {header: {x-specserve-pool: "*"}}
  - {model: smollm2-code, pool: code}
  - {path: /v1/completions, pool: code}
"""


def test_the_issue_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(GOOD)
    config = load_fleet(path)
    code = config.pools["code"]
    assert (code.speculate, code.proposer, code.speculate_max_batch) == (4, "ngram", 8)
    assert (code.replicas, code.num_cpus, code.num_threads) == (2, 0.5, 1)
    assert config.pools["bulk"].autoscaling.max_replicas == 3
    assert config.port == 8080 and config.host == "127.0.0.1"


BAD = [
    ({"pools": {"a": {}}}, "f.yaml: default_pool: Field required"),
    ({"default_pool": "x", "pools": {"a": {}}}, "default_pool 'x' is not a pool; pools: ['a']"),
    (
        {"default_pool": "a", "pools": {"a": {"speculate": "many"}}},
        "f.yaml: pool 'a', field speculate: Input should be a valid integer",
    ),
    (
        {"default_pool": "a", "pools": {"a": {"speculat": 4}}},
        "f.yaml: pool 'a', field speculat: Extra inputs are not permitted",
    ),
    (
        {"default_pool": "a", "pools": {"a": {"proposer": "lookahead"}}},
        "f.yaml: pool 'a', field proposer: Input should be "
        "'auto', 'draft', 'medusa', 'ngram', 'suffix', 'eagle' or 'hybrid'",
    ),
    (
        {"default_pool": "a", "pools": {"a": {"speculate": -1}}},
        "f.yaml: pool 'a': speculate must be >= 0, got -1",
    ),
    (
        {"default_pool": "a", "pools": {"a": {"proposer": "draft", "speculate": 2}}},
        "f.yaml: pool 'a': proposer 'draft' needs draft_model",
    ),
    (
        {"default_pool": "a", "pools": {"a": {"max_concurrent_requests": 0}}},
        "f.yaml: pool 'a': max_concurrent_requests must be >= 1",
    ),
    (
        {"default_pool": "a", "pools": {"a": {"replicas": 2, "autoscaling": {}}}},
        "f.yaml: pool 'a': give replicas or autoscaling, not both",
    ),
    (
        {"default_pool": "a", "pools": {"a": {"speculation_profile": "p.json", "speculate": 2}}},
        "f.yaml: pool 'a': speculate: this pool takes them from its speculation_profile",
    ),
    (
        {"default_pool": "a", "pools": {"a": {}}, "routes": [{"model": "m", "pool": "b"}]},
        "routes[0]: pool 'b' is not a pool; pools: ['a']",
    ),
    (
        {"default_pool": "a", "pools": {"a": {}}, "routes": [{"model": "m", "path": "/"}]},
        "f.yaml: routes.0: a route matches on exactly one of header, model or path",
    ),
    (
        {"default_pool": "a b", "pools": {"a b": {}}},
        "pool name 'a b': letters, digits",
    ),
]


@pytest.mark.parametrize(("raw", "message"), BAD)
def test_errors_name_the_file_pool_and_field(raw: dict[str, object], message: str) -> None:
    with pytest.raises(FleetConfigError) as err:
        parse_fleet(raw, "f.yaml")
    assert message in str(err.value)


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FleetConfigError, match=r"missing\.yaml: cannot read"):
        load_fleet(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(FleetConfigError, match=r"list\.yaml: a fleet config is a mapping"):
        load_fleet(tmp_path / "list.yaml")


def test_pool_fields_are_serves_flags_with_serves_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    group = build_parser()._subparsers
    assert group is not None
    subcommands = group._group_actions[0]
    assert isinstance(subcommands, argparse._SubParsersAction)
    serve = subcommands.choices["serve"]
    for action in serve._actions:
        monkeypatch.delenv(action.dest.upper(), raising=False)
    flags = {a.dest: a for a in serve._actions if a.option_strings}
    fields = PoolConfig.model_fields
    engine_and_pool = {d for d, a in flags.items() if d not in ("help", "host", "port")}
    engine_and_pool -= {
        "api_key",
        "api_key_file",
        "admin_key_file",  # a fleet has one key, its operator's
        "max_body_bytes",
        "drain_timeout",
        "private_metrics",
        "stream_from_loop",  # uvicorn's sockets: a fleet's replicas answer Ray Serve's proxy
    }
    assert engine_and_pool <= set(fields), engine_and_pool - set(fields)
    for dest in engine_and_pool:
        # the declared default as parsing gives it (argparse runs a string default through the
        # flag's type), whatever the environment holds; the help text says it as declared
        declared = flags[dest].default
        parsed = declared
        if isinstance(declared, str) and flags[dest].type not in (None, str):
            parsed = flags[dest].type(declared)
        assert fields[dest].default == parsed, dest
        assert f"default: {declared}]" in (flags[dest].help or ""), dest
    assert {f.lstrip("-").replace("-", "_") for f in POOL_SERVE_FLAGS} <= set(fields)


def test_speculation_settings_are_live_and_the_rest_restarts() -> None:
    config = parse_fleet(
        {"default_pool": "a", "pools": {"a": {"speculate": 4, "proposer": "ngram"}}}, "t"
    )
    key = restart_key(config.pools["a"])
    for change in (
        {"speculate": 0},
        {"speculate": 2, "speculation_policy": "adaptive"},
        {"speculate_max_batch": 4, "speculate_max_tokens": 64, "ngram_max": 2},
        {"replicas": 3},  # Ray Serve scales without restarting
    ):
        changed = with_changes(config, "a", change).pools["a"]
        assert restart_key(changed) == key, change
    assert live_settings(with_changes(config, "a", {"speculate": 2}).pools["a"])["speculate"] == 2
    for restarting in (
        {"model": "/elsewhere"},
        {"max_running_requests": 8},
        {"proposer": "medusa"},  # loads heads
        {"max_memory": "4GiB"},  # the KV pool is sized for N
    ):
        changed = with_changes(config, "a", restarting).pools["a"]
        assert restart_key(changed) != key, restarting
    plain = parse_fleet({"default_pool": "a", "pools": {"a": {"proposer": "ngram"}}}, "t")
    profiled = with_changes(plain, "a", {"speculation_profile": "p.json"})
    assert restart_key(profiled.pools["a"]) != restart_key(plain.pools["a"])
    assert set(live_settings(config.pools["a"])) == set(LIVE_FIELDS)


def test_set_on_an_unknown_pool_names_the_pools() -> None:
    config = parse_fleet({"default_pool": "a", "pools": {"a": {}, "b": {}}}, "t")
    with pytest.raises(FleetConfigError, match=r"no pool 'c'; pools: \['a', 'b'\]"):
        with_changes(config, "c", {"speculate": 1})
    with pytest.raises(FleetConfigError, match="fleet set a: pool 'a', field speculate"):
        with_changes(config, "a", {"speculate": "x"})


def test_a_fleet_key_is_read_under_the_key_file_rules(fleet_model: Path, tmp_path: Path) -> None:
    """Issue 54 item 8: an inline `api_key` was read whatever the fleet file's mode. It now
    needs a private fleet file, as `--api-key-file` needs a private key file; `api_key_file`
    names such a file instead (relative to the fleet file)."""
    fleet = tmp_path / "fleet.yaml"

    def write(extra: dict[str, object], mode: int) -> Path:
        fleet.write_text(yaml.safe_dump({**two_pools(fleet_model), **extra}))
        fleet.chmod(mode)
        return fleet

    with pytest.raises(FleetConfigError, match=r"fleet.yaml: .*mode 0644.*chmod 600"):
        load_fleet(write({"api_key": "inline-key"}, 0o644))
    assert load_fleet(write({"api_key": "inline-key"}, 0o600)).api_key == "inline-key"
    key = tmp_path / "fleet.key"
    key.write_text("file-key\n")
    key.chmod(0o600)
    assert load_fleet(write({"api_key_file": "fleet.key"}, 0o644)).api_key == "file-key"
    assert read_fleet(fleet)["api_key"] == "file-key" and "api_key_file" not in read_fleet(fleet)
    key.chmod(0o640)
    with pytest.raises(FleetConfigError, match=r"api_key_file .*fleet.key: group or others"):
        load_fleet(fleet)
    key.chmod(0o600)
    with pytest.raises(FleetConfigError, match="not both"):
        load_fleet(write({"api_key_file": "fleet.key", "api_key": "x"}, 0o600))
    key.write_text("a\nb\n")
    with pytest.raises(FleetConfigError, match="holds 2 keys"):
        load_fleet(write({"api_key_file": str(key)}, 0o600))
