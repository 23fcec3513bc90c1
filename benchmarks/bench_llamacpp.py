"""Batch-1 decode and prefill, specserve against llama.cpp's `llama-server` on the same GGUF.

Both servers serve the embedded SmolLM2 Q4_1 GGUF with the same thread count, one after the
other (never both at once), over HTTP, streaming; every prompt is a chat request rendered by the
model's own template and sent as the same token ids (llama.cpp takes ids, specserve the text,
which encodes to those ids: checked). Greedy (llama.cpp: top-k 1), EOS ignored, 128 new tokens,
no prompt cache. Per request, client-side: prefill tok/s = prompt tokens / time to first token,
decode tok/s = (tokens - 1) / (last token - first token). Each side's greedy tokens are compared
with HF transformers' float32 greedy continuation of the same ids.

llama.cpp is not built here: point --llama-server (or $LLAMA_SERVER) at a `llama-server` binary,
e.g. built from the llama-cpp-python sdist's vendored source with
    cmake -B build -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
          -DGGML_AVX512=<ON where the CPU has it> -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama-server -j2
Without one, the script says so and exits 0.

Usage (repo root): python -m benchmarks.bench_llamacpp [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from benchmarks.machine import machine_info, machine_lines, markdown_table
from specserve.bench.workloads import build_workload
from specserve.engine.resources import load_tokenizer
from specserve.models.loader import embedded_default_gguf, resolve_model_dir

NEW_TOKENS = 128


@dataclass(frozen=True)
class Result:
    server: str
    prompt: str  # "short" or "long"
    prompt_tokens: int
    ttft_s: float
    decode_tok_s: float
    tokens: list[int]
    hf_agree: int  # tokens equal to HF's before the first difference


def prompts(tokenizer: Any, n: int) -> dict[str, list[list[int]]]:
    """Chat prompts as token ids: short creative requests and ~900-token code edits."""
    out: dict[str, list[list[int]]] = {}
    for label, workload in (("short", "chat-creative"), ("long", "code-edit")):
        out[label] = []
        for item in build_workload(workload, n, seed=0):
            assert item.messages is not None
            messages = [{"role": m.role, "content": m.content} for m in item.messages]
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            out[label].append(list(tokenizer.encode(text, add_special_tokens=False)))
    return out


def hf_greedy(model_dir: Path, ids: list[int]) -> list[int]:
    """HF transformers' float32 greedy continuation, EOS ignored."""
    model = _hf_model(model_dir)
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        tokens: list[int] = []
        for _ in range(NEW_TOKENS):
            nxt = int(out.logits[0, -1].argmax())
            tokens.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


_HF: dict[Path, Any] = {}


def _hf_model(model_dir: Path) -> Any:
    if model_dir not in _HF:
        import transformers

        load = transformers.AutoModelForCausalLM.from_pretrained
        _HF[model_dir] = load(str(model_dir), dtype=torch.float32).eval()
    return _HF[model_dir]


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            yield json.loads(line[5:])


def stream_llamacpp(
    client: httpx.Client, url: str, ids: list[int]
) -> tuple[float, list[float], list[int]]:
    body = {
        "prompt": ids,
        "n_predict": NEW_TOKENS,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": True,
        "return_tokens": True,
        "samplers": ["top_k"],
        "top_k": 1,
        "temperature": 0.0,
    }
    stamps: list[float] = []
    tokens: list[int] = []
    started = time.perf_counter()
    # One connection per request: this llama-server build shuts down when a kept-alive
    # connection sends a second request. An event's `tokens` can leave out tokens whose text
    # it holds back (incomplete UTF-8); `tokens_predicted` counts them all, for the timing.
    headers = {"Connection": "close"}
    with client.stream("POST", f"{url}/completion", json=body, headers=headers) as r:
        r.raise_for_status()
        for event in sse_events(r):
            if "tokens_predicted" in event:
                stamps += [time.perf_counter()] * (event["tokens_predicted"] - len(stamps))
            tokens += event.get("tokens") or []
    return started, stamps, tokens


def stream_specserve(
    client: httpx.Client, url: str, text: str
) -> tuple[float, list[float], list[int]]:
    body = {"inputs": text, "parameters": {"max_new_tokens": NEW_TOKENS, "ignore_eos": True}}
    stamps: list[float] = []
    tokens: list[int] = []
    started = time.perf_counter()
    with client.stream("POST", f"{url}/generate_stream", json=body) as r:
        r.raise_for_status()
        for event in sse_events(r):
            if "error" in event:
                raise RuntimeError(f"specserve: {event['error']}")
            stamps.append(time.perf_counter())
            tokens.append(event["token"]["id"])
    return started, stamps, tokens


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


def run_side(
    name: str,
    cmd: list[str],
    url: str,
    work: dict[str, list[list[int]]],
    tokenizer: Any,
    hf: dict[tuple[int, ...], list[int]],
    log: Path,
) -> list[Result]:
    proc = serve(cmd, url, log)
    results = []
    try:
        with httpx.Client(timeout=600) as client:
            for label, prompts_ in work.items():
                for i, ids in enumerate([prompts_[0], *prompts_]):  # the first is a warm-up
                    if name == "llama.cpp":
                        started, stamps, tokens = stream_llamacpp(client, url, ids)
                    else:
                        text = tokenizer.decode(ids)
                        started, stamps, tokens = stream_specserve(client, url, text)
                    if i == 0:
                        continue
                    ref = hf[tuple(ids)]
                    agree = next(
                        (j for j, (a, b) in enumerate(zip(tokens, ref, strict=False)) if a != b),
                        min(len(tokens), len(ref)),
                    )
                    decode = (len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-9)
                    results.append(
                        Result(name, label, len(ids), stamps[0] - started, decode, tokens, agree)
                    )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return results


def llama_cmd(binary: str, threads: int) -> list[str]:
    """llama-server on the embedded GGUF: one slot, the same threads for prompt and decode."""
    return [
        binary, "-m", str(embedded_default_gguf()), "--port", "8391", "--host", "127.0.0.1",
        "-t", str(threads), "-tb", str(threads), "-np", "1", "-c", "4096", "--no-webui",
    ]  # fmt: skip


def specserve_cmd(threads: int) -> list[str]:
    """`specserve serve` on the same GGUF (the embedded default), speculation off, and no prefix
    cache: each prompt is sent twice (a warm-up, then the measured one), and llama.cpp runs with
    `cache_prompt: false`."""
    return [
        sys.executable, "-m", "specserve.cli", "serve", "--port", "8392",
        "--num-threads", str(threads), "--speculate", "0", "--no-prefix-caching",
    ]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--llama-server", default=os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=3, help="prompts per length (default 3)")
    p.add_argument("--json", default=None)
    p.add_argument("--logs", default="/tmp", help="where the servers' logs go")
    args = p.parse_args()
    if not args.llama_server or not Path(args.llama_server).is_file():
        print(
            "llama-server not found (--llama-server or $LLAMA_SERVER): nothing to compare; "
            "see this script's docstring for how to build one"
        )
        return
    torch.set_num_threads(args.threads)
    info = machine_info("benchmarks.bench_llamacpp", sys.argv[1:])
    model_dir = resolve_model_dir(None)
    tokenizer = load_tokenizer(model_dir)
    work = prompts(tokenizer, args.prompts)
    for ids in (i for group in work.values() for i in group):  # specserve gets the text
        assert list(tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)) == ids
    hf = {tuple(ids): hf_greedy(model_dir, ids) for group in work.values() for ids in group}
    _HF.clear()
    logs = Path(args.logs)
    sides = [
        ("llama.cpp", llama_cmd(args.llama_server, args.threads), 8391, "bench-llama-server.log"),
        ("specserve", specserve_cmd(args.threads), 8392, "bench-specserve.log"),
    ]
    results = [
        r
        for name, cmd, port, log in sides
        for r in run_side(name, cmd, f"http://127.0.0.1:{port}", work, tokenizer, hf, logs / log)
    ]
    report(info, results)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": info, "results": [asdict(r) for r in results]}, indent=1)
        )


def report(info: dict[str, Any], results: list[Result]) -> None:
    print(machine_lines(info), "\n")
    rows = []
    for label in ("short", "long"):
        side = {
            s: [r for r in results if r.server == s and r.prompt == label]
            for s in ("llama.cpp", "specserve")
        }
        med = {
            s: (
                statistics.median(r.decode_tok_s for r in rs),
                statistics.median(r.prompt_tokens / r.ttft_s for r in rs),
            )
            for s, rs in side.items()
        }
        agree = {
            s: f"{sum(r.hf_agree == NEW_TOKENS for r in rs)}/{len(rs)} "
            f"(first difference at {min(r.hf_agree for r in rs)})"
            for s, rs in side.items()
        }
        tokens = statistics.median(r.prompt_tokens for r in side["specserve"])
        rows.append(
            [
                f"{label} (~{tokens:.0f} tokens)",
                f"{med['llama.cpp'][0]:.1f}",
                f"{med['specserve'][0]:.1f}",
                f"{med['specserve'][0] / med['llama.cpp'][0]:.2f}x",
                f"{med['llama.cpp'][1]:.0f}",
                f"{med['specserve'][1]:.0f}",
                agree["llama.cpp"],
                agree["specserve"],
            ]
        )
    print(
        markdown_table(
            [
                "prompts",
                "llama.cpp decode tok/s",
                "specserve decode tok/s",
                "ours / llama.cpp",
                "llama.cpp prefill tok/s",
                "specserve prefill tok/s",
                "llama.cpp = HF greedy",
                "specserve = HF greedy",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
