"""Files the fleet trusts: the cluster address `fleet up` saved is read back only if this user
wrote it and nobody else can change it (a planted one would send the client, and its Ray token,
elsewhere)."""

from __future__ import annotations

import argparse
import hashlib
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specserve.fleet.cluster import address_file, connect, start_cluster
from specserve.fleet.secrets import read_secret, remove_secrets, write_private, write_secret


def test_a_planted_or_loose_address_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    path = address_file()
    write_private(path, "10.9.8.7:6379")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o666)  # anyone could have written it
    with pytest.raises(SystemExit, match=r"not trusting fleet address file .*: group or others"):
        connect(None)
    os.chmod(path, 0o600)
    if os.getuid() == 0:  # root can make it someone else's
        os.chown(path, 12345, -1)
        with pytest.raises(SystemExit, match="owned by uid 12345"):
            connect(None)


def test_a_secret_file_has_a_random_name_reused_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54 item 8: the ingress' key file was named from the key's hash, and that path goes
    into Ray's world-readable logs (an offline check for a weak key); it stayed after
    `fleet down`. The name is now random; the same key names the same file again (a redeploy
    does not restart the ingress); `remove_secrets` (fleet down, a stopped cluster) removes it."""
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    key = "weak-key"
    path = write_secret("api-key", key)
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert digest[:8] not in path.name and len(path.name) >= len("api-key-") + 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and read_secret(path) == key
    assert write_secret("api-key", key) == path
    other = write_secret("api-key", "another-key")
    assert other != path
    assert remove_secrets() == 2 and not path.exists() and not other.exists()


def test_cmd_down_removes_the_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ray import serve

    from specserve.fleet import cli, deploy

    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    path = write_secret("api-key", "k")
    deleted: list[str] = []
    monkeypatch.setattr(cli, "connect", lambda address: None)
    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(applications={deploy.APP: 1}))
    monkeypatch.setattr(serve, "delete", deleted.append)
    monkeypatch.setattr(deploy, "current_config", lambda: SimpleNamespace(drain_timeout=0))
    monkeypatch.setattr(cli, "_drain", lambda timeout: None)
    assert cli.cmd_down(argparse.Namespace(address=None, drain_timeout=None)) == 0
    assert deleted == [deploy.APP] and not path.exists()


def test_a_started_cluster_has_token_auth_on_and_a_private_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token auth was left to Ray's default, and Ray's token file (written 0644) was made 0600
    only after ray.init returned. Both are set before Ray starts now."""
    monkeypatch.setattr(os, "environ", dict(os.environ))  # start_cluster sets Ray's variables
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    seen: dict[str, object] = {}

    def init(**kwargs: object) -> None:
        token = tmp_path / ".ray" / "auth_token"
        seen["mode"] = os.environ.get("RAY_AUTH_MODE")
        seen["token"] = stat.S_IMODE(token.stat().st_mode) if token.exists() else None
        seen["dir"] = stat.S_IMODE(token.parent.stat().st_mode) if token.exists() else None

    context = SimpleNamespace(gcs_address="127.0.0.1:6379")
    fake = SimpleNamespace(init=init, get_runtime_context=lambda: context)
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert start_cluster(1) == "127.0.0.1:6379"
    assert seen == {"mode": "token", "token": 0o600, "dir": 0o700}
    assert len((tmp_path / ".ray" / "auth_token").read_text()) == 64
