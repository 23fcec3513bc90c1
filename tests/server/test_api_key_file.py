"""--api-key-file (issue 24, item 11): the key from an owner-only file, on no command line; a
file group or others may read is refused at start-up with the fix in the message. Several
lines are several keys, one per tenant (item 10): a tenant's requests reuse cached prompt
blocks of its own requests only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specserve.server.keyfile import admin_key, api_keys, read_key_file
from specserve.server.middleware import tenant_id
from specserve.server.settings import ServerSettings
from tests import http
from tests.server.conftest import TINY_FLAGS, Server, scrape, server_env, start_server

KEY = "file-s3cret"


def key_file(tmp_path: Path, mode: int, text: str = KEY + "\n") -> Path:
    path = tmp_path / "key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_read_key_file(tmp_path: Path) -> None:
    assert read_key_file(str(key_file(tmp_path, 0o600))) == (KEY,)
    assert read_key_file(str(key_file(tmp_path, 0o400))) == (KEY,)
    for mode in (0o640, 0o604, 0o620, 0o644):
        with pytest.raises(ValueError, match=f"mode 0{mode:o}.*chmod 600"):
            read_key_file(str(key_file(tmp_path, mode)))
    with pytest.raises(ValueError, match="empty"):
        read_key_file(str(key_file(tmp_path, 0o600, " \n")))
    assert read_key_file(str(key_file(tmp_path, 0o600, "a\n\n b \n"))) == ("a", "b")
    with pytest.raises(ValueError, match="listed twice"):
        read_key_file(str(key_file(tmp_path, 0o600, "a\nb\na\n")))
    with pytest.raises(ValueError, match="No such file"):
        read_key_file(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not a regular file"):
        read_key_file(str(tmp_path))
    with pytest.raises(ValueError, match="not both"):
        api_keys("k", str(key_file(tmp_path, 0o600)))
    assert api_keys("k", None) == {"api_key": "k"}
    assert api_keys(None, str(key_file(tmp_path, 0o600))) == {"api_key": KEY}
    two = api_keys(None, str(key_file(tmp_path, 0o600, "a\nb\n")))
    assert two == {"tenant_keys": ("a", "b")}


def test_a_long_key_file_is_read_whole_and_a_huge_one_refused(tmp_path: Path) -> None:
    """Issue 54 item 7: the file was read with one 64 KiB read, so keys past it got 401 and the
    key cut at the boundary became a valid shorter key."""
    keys = [f"tenant-{i:05d}-" + "k" * 40 for i in range(2000)]  # ~110 KB
    assert read_key_file(str(key_file(tmp_path, 0o600, "\n".join(keys) + "\n"))) == tuple(keys)
    huge = "x" * 100 + "\n"
    with pytest.raises(ValueError, match="larger than 1048576 bytes"):
        read_key_file(str(key_file(tmp_path, 0o600, huge * 11_000)))


def test_a_readable_key_file_stops_serve_before_loading(tiny_model: Path, tmp_path: Path) -> None:
    path = key_file(tmp_path, 0o644)
    cmd = [sys.executable, "-m", "specserve.cli", "serve", "--model", str(tiny_model)]
    env = server_env({"API_KEY_FILE": str(path)})
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"--api-key-file {path}" in done.stderr and "chmod 600" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def keyed_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path = key_file(tmp_path_factory.mktemp("key"), 0o600)
    log = tmp_path_factory.mktemp("logs") / "keyfile-server.log"
    server = start_server(["--model", str(tiny_model), "--api-key-file", str(path)], log)
    yield server
    server.stop()


def test_the_key_from_the_file_is_required(keyed_server: Server) -> None:
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 2}}
    assert http.post(keyed_server.url + "/generate", json=body).status_code == 401
    headers = {"Authorization": f"Bearer {KEY}"}
    r = http.post(keyed_server.url + "/generate", json=body, headers=headers)
    assert r.status_code == 200, r.text
    cmdline = Path(f"/proc/{keyed_server.proc.pid}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline and os.path.exists(f"/proc/{keyed_server.proc.pid}")


TENANTS = ("tenant-one-key", "tenant-two-key")
ADMIN = "the-operator-key"


@pytest.fixture(scope="module")
def tenant_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path = key_file(tmp_path_factory.mktemp("keys"), 0o600, "\n".join(TENANTS) + "\n")
    admin = key_file(tmp_path_factory.mktemp("admin"), 0o600, ADMIN + "\n")
    log = tmp_path_factory.mktemp("logs") / "tenant-server.log"
    flags = ["--model", str(tiny_model), *TINY_FLAGS, "--api-key-file", str(path)]
    flags += ["--admin-key-file", str(admin)]
    server = start_server([*flags, "--max-input-tokens", "512"], log)  # room for a tool list
    yield server
    server.stop()


def test_each_key_is_a_tenant_with_its_own_prefix_cache(tenant_server: Server) -> None:
    url = tenant_server.url
    prompt = "The quick brown fox jumps over the lazy dog. " * 4  # several cache blocks
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 2}}

    def hits() -> float:
        return scrape(url)["specserve_prefix_cache_hit_tokens_total"]

    def send(key: str | None) -> int:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        return http.post(url + "/generate", json=body, headers=headers, timeout=60).status_code

    assert send(None) == 401 and send("someone-else") == 401
    assert send(TENANTS[0]) == 200
    before = hits()
    assert send(TENANTS[1]) == 200  # the same prompt, another tenant: nothing reused
    assert hits() == before
    assert send(TENANTS[0]) == 200  # its own tenant's prompt: reused
    assert hits() > before
    log = tenant_server.log.read_text()
    assert all(k not in log for k in TENANTS)  # the keys are in no log
    assert tenant_id(TENANTS[0]) != tenant_id(TENANTS[1])


def test_a_tenant_gets_its_tool_calls_as_calls(tenant_server: Server) -> None:
    """Salting a request with its tenant keeps its tools: the reply is a call, not text."""
    tool = {
        "type": "function",
        "function": {
            "name": "pick",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["unit"],
                "additionalProperties": False,
            },
        },
    }
    body = {
        "messages": [{"role": "user", "content": "Pick a unit."}],
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "pick"}},
        "max_tokens": 64,
        "temperature": 0,
    }
    headers = {"Authorization": f"Bearer {TENANTS[1]}"}
    got = http.post(
        tenant_server.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    assert got.status_code == 200, got.text
    choice = got.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "pick"
    assert json.loads(call["function"]["arguments"])["unit"] in ("celsius", "fahrenheit")


def test_only_the_admin_key_resets_caches_or_reads_info(tenant_server: Server) -> None:
    """Issue 54 item 6: tenant B's key emptied the prefix cache every tenant shares. Tenant
    keys now get 403 on the cache resets and /info; the admin key (--admin-key-file) gets them."""
    url = tenant_server.url
    body = {"inputs": "The quick brown fox jumps over the lazy dog. " * 4}
    body["parameters"] = {"max_new_tokens": 2}  # type: ignore[assignment]
    r = http.post(url + "/generate", json=body, headers={"Authorization": f"Bearer {TENANTS[0]}"})
    assert r.status_code == 200, r.text
    for key in TENANTS:
        headers = {"Authorization": f"Bearer {key}"}
        for route in ("/reset_prefix_cache", "/reset_suffix_cache"):
            r = http.post(url + route, headers=headers)
            assert r.status_code == 403 and "admin key" in r.json()["error"], r.text
        assert http.get(url + "/info", headers=headers).status_code == 403
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert http.get(url + "/info", headers=admin).status_code == 200
    r = http.post(url + "/reset_prefix_cache", headers=admin)
    assert r.status_code == 200 and r.json()["blocks"] > 0, r.text
    assert ADMIN not in tenant_server.log.read_text()


def test_the_admin_key_file(tmp_path: Path) -> None:
    assert admin_key(str(key_file(tmp_path, 0o600, "op\n"))) == "op"
    with pytest.raises(ValueError, match=r"--admin-key-file .* holds 2 keys"):
        admin_key(str(key_file(tmp_path, 0o600, "a\nb\n")))
    with pytest.raises(ValueError, match=r"--admin-key-file .*chmod 600"):
        admin_key(str(key_file(tmp_path, 0o644, "op\n")))
    with pytest.raises(ValueError, match="differ from every API key"):
        ServerSettings(model_id="m", tenant_keys=("a", "b"), admin_key="b")
