"""The fleet CLI over a cluster that fails: every error a cluster call can raise becomes one
line on stderr and exit code 1 (not a traceback); a deploy keeps the applications deployed
declaratively beside the fleet (a declarative deploy deletes the ones it does not list)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.exceptions import RayActorError
from ray.serve.exceptions import RayServeException

from specserve.fleet import cli, deploy
from specserve.fleet.config import parse_fleet
from tests.fleet.conftest import two_pools

FAILURES = [
    RayServeException("Application 'x' has a conflicting route prefix"),
    ValueError("1 validation error for ServeDeploySchema"),
    ConnectionError("GCS unreachable"),
    TimeoutError("timed out"),
    RayActorError(),
]


@pytest.mark.parametrize("failure", FAILURES, ids=lambda e: type(e).__name__)
def test_set_and_status_report_cluster_errors(
    failure: Exception, fleet_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    config = parse_fleet(two_pools(fleet_model), "test")
    monkeypatch.setattr(cli, "connect", lambda address: None)
    monkeypatch.setattr(deploy, "current_config", lambda: config)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise failure

    monkeypatch.setattr(deploy, "deploy", fail)
    args = argparse.Namespace(address=None, pool="chat", changes=["speculate=2"])
    assert cli.cmd_set(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err

    monkeypatch.setattr(deploy, "current_config", fail)
    assert cli.cmd_set(args) == 1
    assert "cannot read the running fleet" in capsys.readouterr().err
    monkeypatch.setattr("ray.serve.status", fail)
    assert cli.cmd_status(argparse.Namespace(address=None, json=True)) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_up_reports_a_refused_deploy_and_stops_its_cluster(
    fleet_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(two_pools(fleet_model)))
    stopped: list[bool] = []
    monkeypatch.setattr(cli, "start_cluster", lambda num_cpus: "127.0.0.1:1")
    monkeypatch.setattr(cli, "stop_cluster", lambda: stopped.append(True))

    def refuse(config: Any, timeout_s: float = 0) -> None:
        raise RayServeException("deploy refused")

    monkeypatch.setattr(deploy, "deploy", refuse)
    args = argparse.Namespace(config=path, host=None, port=None, num_cpus=None, address=None)
    assert cli.cmd_up(args) == 1
    assert capsys.readouterr().err == "error: RayServeException: deploy refused\n"
    assert stopped == [True]


def test_a_deploy_keeps_the_declarative_apps_beside_it(fleet_model: Path) -> None:
    neighbour = {"name": "neighbour", "route_prefix": "/n", "import_path": "m:app"}
    details = {
        "applications": {
            "neighbour": {"source": "declarative", "deployed_app_config": neighbour},
            "by-serve-run": {"source": "imperative", "deployed_app_config": None},
            deploy.APP: {"source": "declarative", "deployed_app_config": {"name": deploy.APP}},
        }
    }
    others = deploy.other_apps(details)
    assert others == [neighbour]  # not the fleet's old self, not an imperative app
    config = parse_fleet(two_pools(fleet_model), "test")
    names = [app.name for app in deploy.deploy_schema(config, others).applications]
    assert names == ["neighbour", deploy.APP]
