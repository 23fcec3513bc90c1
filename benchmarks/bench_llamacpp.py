"""specserve against llama.cpp's `llama-server` on the same GGUF: batch 1, many at once, verify.

Both servers serve the embedded SmolLM2 Q4_1 GGUF with the same thread count, one after the
other (never both at once), over HTTP; every prompt is a chat request rendered by the model's
own template and sent as the same token ids (llama.cpp takes ids, specserve the text, which
encodes to those ids: checked). Greedy (llama.cpp: top-k 1), EOS ignored, 128 new tokens, no
prompt cache, speculation off. Three parts:
- batch 1, streaming, short (~50-token) and ~1k-token prompts, specserve in each `--numerics`:
  per request, client-side, prefill tok/s = prompt tokens / time to first token, decode tok/s =
  (tokens - 1) / (last token - first token); each side's greedy tokens compared (first
  difference) with HF transformers' float32 greedy continuation and with llama.cpp's;
- `--concurrency N` requests at once (llama-server `-np N`; specserve in its default numerics):
  aggregate tok/s on the decode-bound short mix and the prefill-bound ~1k-token mix
  (`llamacpp_load.py`);
- verify cost in process (specserve only; llama-server has no verify): one step scoring k + 1
  rows of one sequence (~256 tokens of context) against k = 0, in each numerics, as the
  engine runs them (fp16 KV cache, the native layer stack), and q8 on the GGUF row layout
  (the kernel before rows were interleaved eight at a time), the sides taking turns.

llama.cpp is not built here: point --llama-server (or $LLAMA_SERVER) at a `llama-server` binary:
`LLAMA_SERVER=$(bash scripts/build_llama_server.sh)` builds one for this CPU, or by hand from the
llama-cpp-python sdist's vendored source with
    cmake -B build -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
          -DGGML_AVX512=<ON where the CPU has it> -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama-server -j2
(or -DGGML_NATIVE=ON in place of the instruction-set flags: llama.cpp's kernels for the CPU it
is built on, as in the 2026-12-03 runs of docs/benchmarks.md).
Without one, the script says so and exits 0.

The model is the embedded Q4_1 GGUF, or `--gguf FILE`, or `--quant TYPE`: the embedded model
requantised by llama.cpp's own `llama-quantize --allow-requantize` (built beside llama-server by
scripts/build_llama_server.sh; the file is kept in $SPECSERVE_CACHE/requantised/), so that both
servers serve the same file of that type (Q4_0, Q5_0, Q4_K_M, Q6_K, Q8_0, ...).

`--rounds N` serves each side N times at batch 1, the sides taking turns (llama.cpp, specserve,
llama.cpp, ...); the medians are over rounds and prompts.

Usage (repo root): python -m benchmarks.bench_llamacpp [--threads 2] [--numerics q8,exact]
    [--concurrency 16] [--verify-ks 0,1,2,3,4,5,6,7,8] [--quant TYPE | --gguf FILE] [--json FILE]
    [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from benchmarks.engine_verify import PLAIN_ROWS, engine_verify_costs
from benchmarks.hf_reference import hf_gguf_model
from benchmarks.llamacpp_load import LoadResult, load_side, serve
from benchmarks.llamacpp_report import batch1_table, first_difference, load_table, verify_table
from benchmarks.llamacpp_stream import NEW_TOKENS, stream_llamacpp, stream_specserve
from benchmarks.machine import machine_info, machine_lines
from benchmarks.verify_cost import Point
from specserve.bench.workloads import build_workload
from specserve.config import Numerics
from specserve.engine.resources import load_tokenizer
from specserve.models.loader import DEFAULT_MODEL_FILE, embedded_default_gguf, resolve_model_dir


@dataclass(frozen=True)
class Result:
    server: str  # "llama.cpp", or "specserve q8" / "specserve exact"
    prompt: str  # "short" or "long"
    index: int  # which prompt of its length
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


def hf_greedy(gguf: Path, ids: list[int]) -> list[int]:
    """HF transformers' float32 greedy continuation of the GGUF's weights, EOS ignored."""
    model = _hf_model(gguf)
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        tokens: list[int] = []
        for _ in range(NEW_TOKENS):
            nxt = int(out.logits[0, -1].argmax())
            tokens.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


_HF: dict[Path, Any] = {}


def _hf_model(gguf: Path) -> Any:
    if gguf not in _HF:
        _HF[gguf] = hf_gguf_model(gguf)
    return _HF[gguf]


def requantised(llama_server: str, qtype: str) -> Path:
    """The embedded GGUF requantised to `qtype` by llama-quantize (next to llama-server), once."""
    from specserve.storage import default_cache_dir, private_dir

    out_dir = private_dir(default_cache_dir() / "requantised")
    out = out_dir / DEFAULT_MODEL_FILE.replace("Q4_1", qtype)
    if not out.is_file():
        quantize = Path(llama_server).parent / "llama-quantize"
        staged = out.with_suffix(".tmp")
        cmd = [str(quantize), "--allow-requantize", str(embedded_default_gguf()), str(staged)]
        subprocess.run([*cmd, qtype], check=True, capture_output=True)
        staged.rename(out)
    return out


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
                    agree = first_difference(tokens, ref)
                    decode = (len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-9)
                    ttft = stamps[0] - started
                    results.append(
                        Result(name, label, i - 1, len(ids), ttft, decode, tokens, agree)
                    )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return results


def llama_cmd(binary: str, gguf: Path, threads: int, slots: int = 1) -> list[str]:
    """llama-server on the GGUF: `slots` slots of 2048 tokens each (at least 4096 in all: the
    longest ~1k-token prompt and its 128 new tokens fit a slot), the same threads for prompt
    and decode."""
    return [
        binary, "-m", str(gguf), "--port", "8391", "--host", "127.0.0.1",
        "-t", str(threads), "-tb", str(threads), "-np", str(slots),
        "-c", str(max(4096, 2048 * slots)), "--no-webui",
    ]  # fmt: skip


def specserve_cmd(gguf: Path, threads: int, numerics: Numerics = "q8") -> list[str]:
    """`specserve serve` on the same GGUF, speculation off, and no prefix cache: each prompt is
    sent twice (a warm-up, then the measured one), and llama.cpp runs with `cache_prompt:
    false`."""
    return [
        sys.executable, "-m", "specserve.cli", "serve", "--port", "8392", "--model", str(gguf),
        "--num-threads", str(threads), "--speculate", "0", "--no-prefix-caching",
        "--numerics", numerics,
    ]  # fmt: skip


def load_part(
    args: argparse.Namespace,
    every: dict[str, list[list[int]]],
    tokenizer: Any,
    urls: tuple[str, str],
) -> list[LoadResult]:
    """`--concurrency` requests of each length at once, llama-server (`-np`) then specserve q8."""
    crowd = {label: ids[: args.concurrency] for label, ids in every.items()}
    logs, (llama_url, ours_url) = Path(args.logs), urls
    llama = llama_cmd(args.llama_server, args.gguf, args.threads, args.concurrency)
    load = load_side(
        "llama.cpp", llama, llama_url, crowd, tokenizer, logs / "load-llama.log", NEW_TOKENS
    )
    ours = specserve_cmd(args.gguf, args.threads)
    load += load_side(
        "specserve q8", ours, ours_url, crowd, tokenizer, logs / "load-ours.log", NEW_TOKENS
    )
    print("\n" + load_table(load, args.concurrency), flush=True)
    return load


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--llama-server", default=os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=3, help="prompts per length (default 3)")
    p.add_argument(
        "--rounds", type=int, default=1, help="batch 1: the sides take turns this many times"
    )
    p.add_argument("--numerics", default="q8,exact", help="specserve's sides at batch 1")
    p.add_argument("--concurrency", type=int, default=16, help="requests at once (0: skip)")
    p.add_argument("--verify-ks", default="0,1,2,3,4,5,6,7,8", help="verify cost ('': skip)")
    p.add_argument("--json", default=None)
    p.add_argument("--logs", default="/tmp", help="where the servers' logs go")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--gguf", type=Path, default=None, help="serve this GGUF on both sides")
    which.add_argument(
        "--quant", default=None, help="the embedded model requantised to this type (Q4_K_M, ...)"
    )
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if not args.llama_server or not Path(args.llama_server).is_file():
        print(
            "llama-server not found (--llama-server or $LLAMA_SERVER): nothing to compare; "
            "see this script's docstring for how to build one"
        )
        return
    torch.set_num_threads(args.threads)
    if args.quant:
        args.gguf = requantised(args.llama_server, args.quant)
    args.gguf = (args.gguf or embedded_default_gguf()).resolve()
    info = machine_info("benchmarks.bench_llamacpp", sys.argv[1:])
    info["gguf"] = f"{args.gguf.name} ({args.gguf.stat().st_size} bytes)"
    modes: list[Numerics] = [m for m in ("q8", "exact") if m in args.numerics.split(",")]
    model_dir = resolve_model_dir(str(args.gguf))
    tokenizer = load_tokenizer(model_dir)
    every = prompts(tokenizer, max(args.prompts, args.concurrency))
    work = {label: ids[: args.prompts] for label, ids in every.items()}
    for ids in (i for group in every.values() for i in group):  # specserve gets the text
        assert list(tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)) == ids
    hf = {tuple(ids): hf_greedy(args.gguf, ids) for group in work.values() for ids in group}
    _HF.clear()
    logs, llama_url, ours_url = Path(args.logs), "http://127.0.0.1:8391", "http://127.0.0.1:8392"
    sides = [("llama.cpp", llama_cmd(args.llama_server, args.gguf, args.threads), llama_url)]
    sides += [
        (f"specserve {m}", specserve_cmd(args.gguf, args.threads, m), ours_url) for m in modes
    ]
    results = [
        r
        for _ in range(args.rounds)
        for name, cmd, url in sides
        for r in run_side(name, cmd, url, work, tokenizer, hf, logs / f"bench-{name}.log")
    ]
    print(machine_lines(info), "\n")
    print(batch1_table(results), flush=True)  # each part as it ends: a later one may fail
    load = load_part(args, every, tokenizer, (llama_url, ours_url)) if args.concurrency else []
    ks = [int(k) for k in args.verify_ks.split(",") if k]
    verify_sides: list[str] = [*modes, PLAIN_ROWS] if "q8" in modes else list(modes)
    verify: dict[str, list[Point]] = engine_verify_costs(verify_sides, ks) if ks else {}
    if verify:
        print("\n" + verify_table(verify))
    if args.json:
        out = {
            "machine": info,
            "results": [asdict(r) for r in results],
            "load": [asdict(r) for r in load],
            "verify": {m: [asdict(p) for p in pts] for m, pts in verify.items()},
        }
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
