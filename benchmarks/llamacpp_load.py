"""Many requests at once against llama-server and specserve: aggregate throughput.

Part of `bench_llamacpp` (`--concurrency N`): every request of a mix is sent at once, each on
its own connection (this llama-server build drops a kept-alive connection's second request),
non-streaming, greedy, EOS ignored; llama-server runs `-np N` slots, specserve its default
continuous batching. One warm-up request first. Aggregate tok/s = new tokens of all requests /
wall time from the first send to the last reply, so a prefill-bound mix (~1k-token prompts)
measures mostly prompt processing, a decode-bound one (short prompts) mostly batched decode.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


@dataclass(frozen=True)
class LoadResult:
    server: str
    mix: str  # "short" (decode-bound) or "long" (prefill-bound)
    requests: int
    prompt_tokens: int  # all requests together
    new_tokens: int
    wall_s: float

    @property
    def tok_s(self) -> float:
        return self.new_tokens / self.wall_s


def _llamacpp(client: httpx.Client, url: str, ids: list[int], new_tokens: int) -> int:
    body = {
        "prompt": ids, "n_predict": new_tokens, "ignore_eos": True, "cache_prompt": False,
        "samplers": ["top_k"], "top_k": 1, "temperature": 0.0,
    }  # fmt: skip
    r = client.post(f"{url}/completion", json=body, headers={"Connection": "close"})
    r.raise_for_status()
    return int(r.json()["tokens_predicted"])


def _specserve(client: httpx.Client, url: str, text: str, new_tokens: int) -> int:
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "details": True}
    r = client.post(f"{url}/generate", json={"inputs": text, "parameters": params})
    r.raise_for_status()
    return int(r.json()["details"]["generated_tokens"])


def run_load(
    server: str,
    url: str,
    mix: str,
    prompts: list[list[int]],
    tokenizer: Any,
    new_tokens: int,
) -> LoadResult:
    """All `prompts` at once against the server at `url` (already up)."""

    def one(client: httpx.Client, ids: list[int]) -> int:
        if server == "llama.cpp":
            return _llamacpp(client, url, ids, new_tokens)
        return _specserve(client, url, tokenizer.decode(ids), new_tokens)

    with httpx.Client(timeout=1800) as client, ThreadPoolExecutor(len(prompts)) as pool:
        one(client, prompts[0])  # warm-up
        started = time.perf_counter()
        produced = list(pool.map(lambda ids: one(client, ids), prompts))
        wall = time.perf_counter() - started
    if any(n != new_tokens for n in produced):
        raise RuntimeError(f"{server}: expected {new_tokens} new tokens each, got {produced}")
    return LoadResult(server, mix, len(prompts), sum(map(len, prompts)), sum(produced), wall)


def serve(cmd: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[0]} exited early; see {log}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not answer /health; see {log}")


def load_side(
    name: str,
    cmd: list[str],
    url: str,
    work: dict[str, list[list[int]]],
    tokenizer: Any,
    log: Path,
    new_tokens: int,
) -> list[LoadResult]:
    """Each mix's prompts all at once against one server."""
    proc = serve(cmd, url, log)
    try:
        return [run_load(name, url, mix, ids, tokenizer, new_tokens) for mix, ids in work.items()]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
