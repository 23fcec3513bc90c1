"""A plain stream's inter-token gaps while distinct large JSON schemas compile beside it.

Issue 54 item 2: a compile held the lock the engine's thread takes to admit a grammar request,
so one client sending distinct schemas stalled every stream (a 237 ms gap against 10 ms alone,
24 schemas, over HTTP). In process, on one `AsyncEngine`: a plain greedy stream alone, then the
same stream while `--schemas` requests, each with a distinct schema of `--properties`
properties, are sent at once after its first tokens (llguidance's tokenizer is built before,
by a small grammar request, so what is measured is the schemas' compiles). The same requests
with their schemas compiled beforehand show what their admission and masks cost the stream
alone (24 sequences joining a step); the difference is the compiles'. Reported: the stream's
largest and median gaps between outputs, and the window in which the schema requests ran.

    python -m benchmarks.bench_grammar_stall [--schemas 24] [--properties 80] [--tokens 160]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROMPT = "Write a long story about a lighthouse keeper and the sea."


@dataclass(frozen=True)
class Gaps:
    side: str
    tokens: int
    max_ms: float
    p50_ms: float
    window_s: float  # alone: 0; else from sending the schemas until the last one finished


def schema(i: int, properties: int) -> dict[str, Any]:
    """A large schema unlike every other (its property names carry `i`)."""
    props: dict[str, Any] = {}
    for j in range(properties):
        kind = j % 4
        if kind == 0:
            props[f"field_{i}_{j}"] = {"type": "string", "maxLength": 40}
        elif kind == 1:
            props[f"count_{i}_{j}"] = {"type": "integer", "minimum": 0, "maximum": 1000 + i}
        elif kind == 2:
            props[f"choice_{i}_{j}"] = {"enum": [f"a{i}", f"b{j}", f"c{i}{j}"]}
        else:
            props[f"code_{i}_{j}"] = {
                "type": "string",
                "pattern": f"[A-Z]{{2}}-[0-9]{{{1 + j % 5}}}",
            }
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


async def stream(engine: Any, tokens: int, started: asyncio.Event | None) -> list[float]:
    """The stream's output times; `started` is set after its first 8 outputs."""
    from specserve.request import SamplingParams

    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    stamps: list[float] = []
    async for _ in engine.generate(PROMPT, params):
        stamps.append(time.perf_counter())
        if started is not None and len(stamps) == 8:
            started.set()
    return stamps


async def constrained(engine: Any, spec: Any) -> None:
    from specserve.request import SamplingParams

    async for _ in engine.generate(
        "Fill in the form.", SamplingParams(max_new_tokens=2, grammar=spec)
    ):
        pass


async def with_schemas(
    engine: Any, args: argparse.Namespace, salt: int, precompile: bool
) -> tuple[list[float], float]:
    """The stream's output times beside `args.schemas` schema requests sent after its first
    tokens, and how long those took; `precompile`: their schemas compiled before the stream
    starts (what is left is their admission and masks)."""
    from specserve.request import GrammarSpec

    specs = [
        GrammarSpec("json_schema", json.dumps(schema(salt * 1000 + i, args.properties)))
        for i in range(args.schemas)
    ]
    if precompile:
        for spec in specs:
            await asyncio.to_thread(engine.engine.grammars.compile, spec)
    started = asyncio.Event()
    plain = asyncio.create_task(stream(engine, args.tokens, started))
    await started.wait()
    sent = time.perf_counter()
    await asyncio.gather(*(constrained(engine, s) for s in specs))
    window = time.perf_counter() - sent
    return await plain, window


def gaps(side: str, stamps: list[float], window: float) -> Gaps:
    diffs = [1000 * (b - a) for a, b in itertools.pairwise(stamps)]
    return Gaps(side, len(stamps), max(diffs), statistics.median(diffs), window)


async def run(args: argparse.Namespace) -> list[Gaps]:
    from specserve.config import EngineConfig
    from specserve.engine.async_engine import AsyncEngine
    from specserve.engine.engine import Engine
    from specserve.request import GrammarSpec

    engine = AsyncEngine(lambda: Engine(EngineConfig(num_threads=args.threads)))
    try:
        await constrained(engine, GrammarSpec("regex", "[0-9]{3}"))  # llguidance's tokenizer
        await stream(engine, 16, None)  # warm-up
        out = []
        n = args.schemas
        for r in range(args.repeats):
            out.append(gaps("alone", await stream(engine, args.tokens, None), 0.0))
            stamps, window = await with_schemas(engine, args, 2 * r, precompile=True)
            out.append(gaps(f"{n} schema requests, compiled before", stamps, window))
            stamps, window = await with_schemas(engine, args, 2 * r + 1, precompile=False)
            out.append(gaps(f"{n} schema requests, schemas compiling", stamps, window))
        return out
    finally:
        await engine.shutdown()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schemas", type=int, default=24)
    ap.add_argument("--properties", type=int, default=80, help="properties per schema")
    ap.add_argument("--tokens", type=int, default=160, help="the plain stream's length")
    ap.add_argument("--threads", type=int, default=2, help="the engine's compute threads")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", help="write the results here too")
    return ap.parse_args()


def main() -> None:
    from benchmarks.machine import machine_info, machine_lines, markdown_table

    args = parse_args()
    info = machine_info("benchmarks.bench_grammar_stall", sys.argv[1:])
    results = asyncio.run(run(args))
    rows = [
        [g.side, str(g.tokens), f"{g.max_ms:.1f}", f"{g.p50_ms:.1f}", f"{g.window_s:.2f}"]
        for g in results
    ]
    header = ["stream", "outputs", "max gap ms", "median gap ms", "schemas' window s"]
    print(machine_lines(info) + "\n\n" + markdown_table(header, rows))
    if args.json:
        data = {"machine": info, "results": [asdict(g) for g in results]}
        Path(args.json).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
