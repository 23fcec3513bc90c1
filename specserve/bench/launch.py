"""`specserve bench --launch`: start a fresh server per N on a free loopback port and wait
until it answers /health.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any


# ------------------------------------------------------------------------------ --launch
def launch_argv(cmd: str, n: int, port: int) -> list[str]:
    """The server command for N: placeholders filled, else `--port P --speculate N` appended."""
    if "{port}" in cmd or "{speculate}" in cmd:
        return shlex.split(cmd.format(port=port, speculate=n))
    return [*shlex.split(cmd), "--port", str(port), "--speculate", str(n)]


@contextlib.asynccontextmanager
async def launched(cmd: str, n: int, timeout: float, out_dir: Path) -> AsyncIterator[str]:
    """A fresh server with N = n on a free loopback port; its log goes to out_dir."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with open(out_dir / f"server-N{n}.log", "wb") as log:
        proc = subprocess.Popen(launch_argv(cmd, n, port), stdout=log, stderr=subprocess.STDOUT)
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                await _wait_healthy(client, proc, timeout)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _wait_healthy(client: Any, proc: subprocess.Popen[bytes], timeout: float) -> None:
    import httpx

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"launched server exited with code {proc.returncode}; "
                "see its server-N*.log in --out"
            )
        try:
            if (await client.get("/health", timeout=5)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"launched server did not answer /health within {timeout:g} s")
