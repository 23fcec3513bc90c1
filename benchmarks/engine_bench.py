"""Issue 2's benchmark: our engine against HF transformers `generate` on the same SmolLM2 weights.

Every side computes in fp32, greedy, EOS ignored, on the same prompts: Lee-corpus news articles
(the ``summarize`` workload of `specserve.bench.workloads`) cut to exactly ``--prompt-tokens``
tokens. HF runs the float32 weights dequantised from the GGUF. Ours runs by default on the GGUF's
own Q4_1/Q8_0 blocks through the CPU block kernels (the same weights, decoded exactly); the side
"ours, dense weights" (``--dense-weights``) runs on the same float32 weights HF runs.

- batch 1: prefill = submit -> first token; decode tok/s = (new_tokens - 1) / (first token ->
  last token). HF's token times come from a streamer, so both sides are clocked alike. Ours is
  also given as a share of the weight-bandwidth bound (DESIGN.md, "Machine facts").
- batch B (default 16): B requests at once; aggregate tok/s = B * new_tokens / (submit -> last
  token). Ours: continuous batching. HF: one static-batch `generate`, left-padded with a mask.
- peak RSS: each side runs in its own subprocess (``--only``), so the peaks are separable.

    python -m benchmarks.engine_bench [--threads 2] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine_report import render, summarise
from benchmarks.machine import machine_info
from benchmarks.rss import peak_rss_mib, reset_rss_peak, status_mib
from specserve.bench.workloads import build_workload

MODULE = "benchmarks.engine_bench"


@dataclass(frozen=True)
class Timing:
    """One timed generation of a batch."""

    total_s: float  # submit -> last token
    prefill_s: float | None  # submit -> first token; None where it was not observed
    tokens: list[list[int]]  # [batch][new_tokens] generated ids

    @property
    def decode_tok_s(self) -> float:
        """Per-sequence decode rate, first token -> last token (batch 1)."""
        assert self.prefill_s is not None
        return (len(self.tokens[0]) - 1) / max(self.total_s - self.prefill_s, 1e-9)

    @property
    def aggregate_tok_s(self) -> float:
        return sum(map(len, self.tokens)) / self.total_s


# ---------------------------------------------------------------- prompts and timing


def build_prompts(tokenizer: Any, n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` distinct Lee-corpus summarisation requests, each cut to exactly ``length`` tokens."""
    prompts = []
    for item in build_workload("summarize", 4 * n, seed):
        ids = list(tokenizer.encode(item.text, add_special_tokens=False))
        if len(ids) >= length:
            prompts.append(ids[:length])
        if len(prompts) == n:
            return prompts
    raise ValueError(f"fewer than {n} Lee articles have {length} tokens; lower --prompt-tokens")


def measure(
    run: Callable[[list[list[int]], int], Timing],
    prompts: list[list[int]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Warm up, then batch-1 repeats (prompt r for repeat r) and batch-B repeats."""
    loading_peak, loaded = peak_rss_mib(), status_mib("VmRSS")
    reset_rss_peak()
    batch = prompts[: args.batch]
    run(prompts[:1], 4)
    run(batch, 2)
    single = [run([prompts[r % len(prompts)]], args.new_tokens) for r in range(args.repeats)]
    multi = [run(batch, args.new_tokens) for _ in range(args.repeats)]
    return {
        "batch1_prefill_s": [t.prefill_s for t in single],
        "batch1_decode_tok_s": [t.decode_tok_s for t in single],
        "batch1_tokens": [t.tokens[0] for t in single],
        "batch_total_s": [t.total_s for t in multi],
        "batch_aggregate_tok_s": [t.aggregate_tok_s for t in multi],
        "batch_tokens_generated": sum(map(len, multi[0].tokens)),
        "rss_after_load_mib": loaded,
        "peak_rss_generating_mib": peak_rss_mib(),
        "peak_rss_mib": max(loading_peak, peak_rss_mib()),
    }


def streamed_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of projection weights read per decode step: float32 matrices or GGUF blocks."""
    from specserve.models.block_linear import BlockLinear

    total = 0
    for module in model.modules():
        if isinstance(module, BlockLinear):
            total += module.blocks.numel()
        elif isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total


def run_ours(args: argparse.Namespace, dense: bool = False) -> dict[str, Any]:
    from specserve.config import CacheConfig, EngineConfig
    from specserve.engine.engine import Engine
    from specserve.request import SamplingParams

    blocks = -(-(args.prompt_tokens + args.new_tokens) // CacheConfig.block_size) + 1
    # No prefix caching: the repeats resend the same prompts, which HF computes every time.
    cache = (
        CacheConfig(max_kv_bytes=args.kv_cache_bytes, prefix_caching=False)
        if args.kv_cache_bytes
        else CacheConfig(num_blocks=args.batch * blocks, prefix_caching=False)  # + 1 block each
    )
    config = EngineConfig(
        device=args.device, num_threads=args.threads, cache=cache, dense_weights=dense
    )
    engine = Engine(config)

    def run(prompts: list[list[int]], new_tokens: int) -> Timing:
        params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        start = time.perf_counter()
        ids = [engine.add_request(p, params) for p in prompts]
        out: dict[str, list[int]] = {i: [] for i in ids}
        first = None
        while engine.has_work():
            step = engine.step()
            now = time.perf_counter()
            for o in step:
                out[o.request_id] += o.new_token_ids
            if first is None and any(o.new_token_ids for o in step):
                first = now
        end = time.perf_counter()
        return Timing(end - start, None if first is None else first - start, list(out.values()))

    prompts = build_prompts(engine.tokenizer, _num_prompts(args), args.prompt_tokens, args.seed)
    result = measure(run, prompts, args)
    result["kv_pool_mib"] = engine.res.runner.kv_bytes / 2**20
    result["weight_mib"] = engine.res.weight_bytes / 2**20
    result["streamed_weight_mib"] = streamed_weight_bytes(engine.res.model) / 2**20
    return result


class _TokenClock:
    """An HF streamer that timestamps every `put`: the prompt first, then each new token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        del value
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def run_hf(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from benchmarks.hf_reference import hf_gguf_model
    from specserve.models.loader import embedded_default_gguf, resolve_model_dir

    model_dir = str(resolve_model_dir(None))
    model = hf_gguf_model(embedded_default_gguf(), attn_implementation=args.hf_attn)
    model = model.to(args.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @torch.inference_mode()
    def run(prompts: list[list[int]], new_tokens: int) -> Timing:
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=args.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        clock = _TokenClock() if len(prompts) == 1 else None  # HF streams batch 1 only
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=mask.to(args.device),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,  # ignore EOS: every row emits exactly new_tokens
            pad_token_id=pad,
            streamer=clock,
        )
        tokens = out[:, width:].tolist()
        end = time.perf_counter()
        prefill = clock.times[1] - start if clock else None
        return Timing(end - start, prefill, tokens)

    prompts = build_prompts(tokenizer, _num_prompts(args), args.prompt_tokens, args.seed)
    return measure(run, prompts, args)


def _num_prompts(args: argparse.Namespace) -> int:
    return max(args.batch, args.repeats)


# ---------------------------------------------------------------- orchestration


def run_side(args: argparse.Namespace, side: str, attn: str) -> dict[str, Any]:
    """One side in a fresh interpreter, so its peak RSS is its own."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", MODULE, *child_argv(args), "--only", side]
        cmd += ["--hf-attn", attn, "--json", str(path)]
        print(f"[engine_bench] running {side} {attn if side == 'hf' else ''}", file=sys.stderr)
        subprocess.run(cmd, check=True)
        return dict(json.loads(path.read_text()))


def child_argv(args: argparse.Namespace) -> list[str]:
    flags = ("threads", "repeats", "new_tokens", "prompt_tokens", "batch", "seed", "device")
    argv = [x for f in flags for x in (f"--{f.replace('_', '-')}", str(getattr(args, f)))]
    return argv + (["--kv-cache-bytes", str(args.kv_cache_bytes)] if args.kv_cache_bytes else [])


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads per side")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=16, help="concurrent requests for aggregate tok/s")
    p.add_argument("--hf-attn", default="eager,sdpa", help="comma list of HF attn_implementation")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0, help="workload seed (which articles)")
    p.add_argument("--kv-cache-bytes", type=int, default=None, help="default: sized to the batch")
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    p.add_argument(
        "--no-dense",
        action="store_true",
        help="skip the side running ours on float32 weights dequantised from the GGUF",
    )
    p.add_argument(
        "--only", choices=("ours", "ours-dense", "hf"), default=None, help=argparse.SUPPRESS
    )
    args = p.parse_args(argv)
    if args.new_tokens < 2 or args.prompt_tokens < 1 or args.repeats < 1 or args.batch < 1:
        p.error("need --new-tokens >= 2 and --prompt-tokens, --repeats, --batch >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.only is not None:
        if args.only == "hf":
            result = run_hf(args)
        else:
            result = run_ours(args, dense=args.only == "ours-dense")
        args.json.write_text(json.dumps(result))
        return 0
    info = machine_info(MODULE, argv)
    sides = {"ours": run_side(args, "ours", "")}
    if not args.no_dense:
        sides["ours-dense"] = run_side(args, "ours-dense", "")
    for attn in args.hf_attn.split(","):
        sides[f"hf-{attn}"] = run_side(args, "hf", attn)
    print(render(args, info, sides))
    if args.json is not None:
        config = {k: v for k, v in vars(args).items() if k not in ("json", "only")}
        report = {"machine": info, "config": config, "sides": sides, "summary": summarise(sides)}
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
