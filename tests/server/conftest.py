"""Real servers for the HTTP tests: `specserve serve` subprocesses on 127.0.0.1.

- `tiny_server`: a tiny random Llama (context stretched to 4096 so long requests last seconds),
  speculation N=4, 4 concurrent requests, 64 input tokens, 200 kB bodies. Most tests use it.
- `smol_server`: the embedded SmolLM2-135M-Instruct with speculation on, for the client SDKs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import http
from tests.tiny import TINY_CONTEXT, make_tiny_model

# Flags' environment forms that would leak from the caller's shell into the servers.
_FLAG_ENV = (
    "MODEL_ID",
    "SPECULATE",
    "PROPOSER",
    "DRAFT_MODEL",
    "SPECSERVE_HOST",
    "PORT",
    "MAX_INPUT_TOKENS",
    "MAX_TOTAL_TOKENS",
    "MAX_BATCH_TOKENS",
    "MAX_CONCURRENT_REQUESTS",
    "API_KEY",
    "DEVICE",
    "NUMERICS",
    "NUM_THREADS",
    "MAX_BODY_BYTES",
    "KV_CACHE_BYTES",
    "MAX_RUNNING_REQUESTS",
    "SPECULATION_POLICY",
    "SPECULATE_MAX_BATCH",
    "SPECULATE_MAX_TOKENS",
    "MAX_MEMORY",
    "NGRAM_MAX",
    "DRAIN_TIMEOUT",
    "SPECULATION_PROFILE",
    "PROFILE_WORKLOAD",
    "STRICT_PROFILE",
    "STREAM_FROM_LOOP",
)
TINY_FLAGS = [
    "--speculate",
    "4",
    "--max-concurrent-requests",
    "4",
    "--max-input-tokens",
    "64",
    "--max-total-tokens",
    str(TINY_CONTEXT),
    "--kv-cache-bytes",
    "16000000",
    "--max-body-bytes",
    "200000",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def server_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without flag variables, single-threaded, plus `env`."""
    full_env = {k: v for k, v in os.environ.items() if k not in _FLAG_ENV}
    full_env |= {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    return full_env | {"TOKENIZERS_PARALLELISM": "false", **(env or {})}


def start_server(
    flags: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 180
) -> Server:
    """`specserve serve` with `flags` (and flag environment variables from `env` only)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "specserve.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-threads",
        "1",
        *flags,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=server_env(env))
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            if http.get(server.url + "/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"server did not become healthy in {timeout} s:\n{server.log_tail()}")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("server-tiny"))


@pytest.fixture(scope="session")
def tiny_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("logs") / "tiny-server.log"
    server = start_server(["--model", str(tiny_model), *TINY_FLAGS], log)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def wide_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The tiny model with room in its prompts for a tool list."""
    log = tmp_path_factory.mktemp("logs") / "wide-server.log"
    server = start_server(
        ["--model", str(tiny_model), *TINY_FLAGS, "--max-input-tokens", "512"], log
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def smol_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("logs") / "smol-server.log"
    flags = ["--speculate", "4", "--kv-cache-bytes", "100000000", "--max-total-tokens", "2048"]
    server = start_server(flags, log)
    yield server
    server.stop()


# --------------------------------------------------------------------------------- helpers
def scrape(url: str) -> dict[str, float]:
    """Every sample of /metrics as `name{label="v",...}` -> value (labels sorted)."""
    text = http.get(url + "/metrics").text
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def wait_for(
    url: str, predicate: Callable[[dict[str, float]], bool], timeout: float = 15.0
) -> dict[str, float]:
    """Poll /metrics until `predicate(samples)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        if predicate(m):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never satisfied the predicate: {m}")
        time.sleep(0.05)


def idle(url: str) -> dict[str, float]:
    """Wait until no request is in flight and no KV block is held, the target's or a draft
    model's."""
    return wait_for(
        url,
        lambda m: (
            m["specserve_requests_in_flight"] == 0
            and m["specserve_kv_cache_blocks_used"] == 0
            and m["specserve_draft_kv_cache_blocks_used"] == 0
        ),
    )


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            yield json.loads(line[5:])


LONG = {"max_new_tokens": 3000, "ignore_eos": True, "speculate": 0}
# A server whose engine steps last at least 5 ms (tests/hooks): LONG then takes at least 15 s
# on any machine, so a test can act on it while it runs.
STEP_FLOOR_S = 0.005


def floored_env(floor_s: float = STEP_FLOOR_S, **hooks: str) -> dict[str, str]:
    """The environment that makes a test process's engine steps last at least `floor_s`, plus
    other hooks of tests/hooks/step_hooks.py by variable name (an engine observer)."""
    path = [str(Path(__file__).parent.parent / "hooks"), os.environ.get("PYTHONPATH", "")]
    return {
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "SPECSERVE_OBSERVERS": "step_hooks:observer",
        "SPECSERVE_TEST_STEP_FLOOR_S": str(floor_s),
        **hooks,
    }


@pytest.fixture(scope="session")
def long_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`tiny_server`'s flags with floored steps: LONG requests outlast what a test does."""
    log = tmp_path_factory.mktemp("logs") / "long-server.log"
    server = start_server(["--model", str(tiny_model), *TINY_FLAGS], log, env=floored_env())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def draft_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The tiny model with a noisy copy of itself as the draft model (its own KV pool); steps
    floored as `long_server`'s (only the disconnect tests use it); static drafts, as they
    count them (the adaptive default prices the draft model's calls, which a busy machine can
    price out)."""
    from tests.tiny import noisy_copy

    draft = noisy_copy(tiny_model, tmp_path_factory.mktemp("server-draft"), noise=0.3)
    log = tmp_path_factory.mktemp("logs") / "draft-server.log"
    flags = ["--model", str(tiny_model), *TINY_FLAGS, "--proposer", "draft"]
    flags += ["--speculation-policy", "static"]
    server = start_server([*flags, "--draft-model", str(draft)], log, env=floored_env())
    yield server
    server.stop()
