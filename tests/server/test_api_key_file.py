"""--api-key-file (issue 24, item 11): the key from an owner-only file, on no command line; a
file group or others may read is refused at start-up with the fix in the message."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specserve.server.keyfile import api_key, read_key_file
from tests.server.conftest import Server, server_env, start_server

KEY = "file-s3cret"


def key_file(tmp_path: Path, mode: int, text: str = KEY + "\n") -> Path:
    path = tmp_path / "key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_read_key_file(tmp_path: Path) -> None:
    assert read_key_file(str(key_file(tmp_path, 0o600))) == KEY
    assert read_key_file(str(key_file(tmp_path, 0o400))) == KEY
    for mode in (0o640, 0o604, 0o620, 0o644):
        with pytest.raises(ValueError, match=f"mode 0{mode:o}.*chmod 600"):
            read_key_file(str(key_file(tmp_path, mode)))
    with pytest.raises(ValueError, match="empty"):
        read_key_file(str(key_file(tmp_path, 0o600, " \n")))
    with pytest.raises(ValueError, match="one line"):
        read_key_file(str(key_file(tmp_path, 0o600, "a\nb\n")))
    with pytest.raises(ValueError, match="No such file"):
        read_key_file(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not a regular file"):
        read_key_file(str(tmp_path))
    with pytest.raises(ValueError, match="not both"):
        api_key("k", str(key_file(tmp_path, 0o600)))
    assert api_key("k", None) == "k"


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
    assert httpx.post(keyed_server.url + "/generate", json=body).status_code == 401
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(keyed_server.url + "/generate", json=body, headers=headers)
    assert r.status_code == 200, r.text
    cmdline = Path(f"/proc/{keyed_server.proc.pid}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline and os.path.exists(f"/proc/{keyed_server.proc.pid}")
