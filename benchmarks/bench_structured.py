"""Speculation under a grammar at batch 1: extraction of hand-written documents into JSON schemas.

Every request is one document (written for this benchmark; no built-in workload uses the text)
with the instruction to extract fields into JSON, the chat template applied, greedy, the output
constrained by the item's schema (llguidance, fixed separators; every string at most 60
characters and every array at most 6 items, so that a small model's repetition cannot run an
output past the token budget). Three sides, each its own engine
in this process with the prefix cache off (no side reuses another's prompt), taking turns item by
item:

- off: `--speculate 0`;
- forced only: `--speculate N` with a proposer that never finds a draft, so every verified draft
  is text the grammar forced (`", "key": "`, closing quotes and braces, the rest of an enum);
- lookup + forced: `--speculate N` with the n-gram proposer (drafts from the prompt, which the
  values are copied from), forced text where the grammar forces it.

Per side: end-to-end tok/s over all requests (prefill included), the ratio to off, and the
drafted/accepted counts of each kind. Outputs are compared token for token across the sides and
each is parsed and checked against its schema's required keys. Then the mask's cost:
`--mask-concurrency` constrained requests at once (speculation off), the time inside the
grammar's logits processors against the steps' wall time.

Usage (repo root): python -m benchmarks.bench_structured [--speculate 4] [--threads 2]
    [--repeats 2] [--mask-concurrency 16] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.structured_docs import DOCS
from specserve.speculation.proposer import Draft, Proposer

NEW_TOKENS = 384


@dataclass(frozen=True)
class Side:
    name: str
    requests: int
    tokens: int
    seconds: float
    tok_s: float
    lookup_drafted: int
    lookup_accepted: int
    forced_drafted: int
    forced_accepted: int
    valid: int  # outputs that parse and carry every required key


class Silent(Proposer):
    """A proposer that never finds a draft (forced text is then the only draft)."""

    name = "silent"

    def propose(self, seqs: list[Any], ks: list[int]) -> list[Draft]:
        return [Draft([]) for _ in ks]

    def sync(self, seq: Any, hidden: Any) -> None:
        del seq, hidden

    def release(self, seq: Any) -> None:
        del seq


def build(speculate: int, threads: int, silent: bool) -> Any:
    from specserve.config import CacheConfig, EngineConfig, SpecConfig
    from specserve.engine.engine import Engine

    config = EngineConfig(
        num_threads=threads,
        spec=SpecConfig(speculate=speculate, proposer="ngram"),
        cache=CacheConfig(prefix_caching=False),
    )
    engine = Engine(config)
    if silent:
        engine.use_proposer(Silent())
    return engine


def run_one(engine: Any, messages: list[dict[str, str]], schema: dict[str, Any]) -> list[int]:
    from specserve.request import GrammarSpec, SamplingParams

    spec = GrammarSpec("json_schema", json.dumps(schema, sort_keys=True))
    params = SamplingParams(max_new_tokens=NEW_TOKENS, grammar=spec)
    rid = engine.add_request(engine.encode_chat(messages), params)
    tokens: list[int] = []
    while engine.has_work():
        for out in engine.step():
            if out.request_id == rid:
                tokens += out.new_token_ids
    return tokens


def compile_times(engine: Any) -> dict[str, float]:
    """Milliseconds: llguidance's tokenizer built from ours (once per engine), then each
    document's schema compiled (its first mask included, see `Grammars.compile`)."""
    from specserve.request import GrammarSpec

    started = time.perf_counter()
    engine.grammars._tokenizer()
    times = {"tokenizer": 1000 * (time.perf_counter() - started)}
    for i, (_, schema) in enumerate(DOCS):
        started = time.perf_counter()
        engine.grammars.compile(GrammarSpec("json_schema", json.dumps(schema, sort_keys=True)))
        times[f"schema {i}"] = 1000 * (time.perf_counter() - started)
    return times


def mask_cost(engine: Any, concurrency: int) -> dict[str, float]:
    """`concurrency` constrained requests at once (the documents in turn) on `engine`: the
    time spent in the grammar's logits processors (the masks) against the steps' time."""
    from specserve.grammar import GrammarProcessor
    from specserve.request import GrammarSpec, SamplingParams

    spent = [0.0, 0]
    call = GrammarProcessor.__call__

    def timed(self: GrammarProcessor, history: Any, logits: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(self, history, logits)
        finally:
            spent[0] += time.perf_counter() - started
            spent[1] += 1

    GrammarProcessor.__call__ = timed  # type: ignore[method-assign]
    try:
        for i in range(concurrency):
            doc, schema = DOCS[i % len(DOCS)]
            spec = GrammarSpec("json_schema", json.dumps(schema, sort_keys=True))
            messages = [
                {"role": "system", "content": "Extract the fields of the document as JSON."},
                {"role": "user", "content": doc},
            ]
            params = SamplingParams(max_new_tokens=NEW_TOKENS, grammar=spec)
            engine.add_request(engine.encode_chat(messages), params)
        tokens, steps, started = 0, 0, time.perf_counter()
        while engine.has_work():
            tokens += sum(len(o.new_token_ids) for o in engine.step())
            steps += 1
        wall = time.perf_counter() - started
    finally:
        GrammarProcessor.__call__ = call  # type: ignore[method-assign]
    return {
        "concurrency": concurrency,
        "tokens": tokens,
        "steps": steps,
        "wall_s": wall,
        "mask_s": spent[0],
        "mask_rows": spent[1],
        "mask_share": spent[0] / wall,
        "mask_us_per_row": 1e6 * spent[0] / max(1, spent[1]),
    }


def valid(text: str, schema: dict[str, Any]) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and set(schema["required"]) <= set(value)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--speculate", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="passes over the documents")
    p.add_argument("--mask-concurrency", type=int, default=16, help="0: skip the mask's cost")
    p.add_argument("--json", default=None)
    return p.parse_args()


def run_sides(engines: dict[str, Any], repeats: int) -> list[Side]:
    """Every document through every side, the sides taking turns in a rotated order; exits
    when the sides' outputs differ."""
    names = list(engines)
    seconds = dict.fromkeys(names, 0.0)
    tokens = dict.fromkeys(names, 0)
    ok = dict.fromkeys(names, 0)
    warm: dict[str, tuple[int, int, int, int]] = {}  # the draft counts the warm-up left
    for name, engine in engines.items():  # warm-up: the tokenizer conversion, the first schema
        run_one(engine, [{"role": "user", "content": "hi"}], DOCS[0][1])
        warm[name] = draft_counts(engine)
    for r in range(repeats):
        for i, (doc, schema) in enumerate(DOCS):
            messages = [
                {"role": "system", "content": "Extract the fields of the document as JSON."},
                {"role": "user", "content": doc},
            ]
            outs = {}
            for name in names[r % 3 :] + names[: r % 3]:
                started = time.perf_counter()
                outs[name] = run_one(engines[name], messages, schema)
                seconds[name] += time.perf_counter() - started
                tokens[name] += len(outs[name])
                text = engines[name].tokenizer.decode(outs[name], skip_special_tokens=True)
                ok[name] += valid(text, schema)
            if len({tuple(o) for o in outs.values()}) != 1:
                raise SystemExit(f"document {i}: the sides' outputs differ")
    sides = []
    for name, engine in engines.items():
        drafted, accepted, forced, forced_accepted = (
            n - w for n, w in zip(draft_counts(engine), warm[name], strict=True)
        )
        sides.append(
            Side(
                name, repeats * len(DOCS), tokens[name], seconds[name],
                tokens[name] / seconds[name], drafted, accepted, forced, forced_accepted, ok[name],
            )
        )  # fmt: skip
    return sides


def draft_counts(engine: Any) -> tuple[int, int, int, int]:
    """Drafted and accepted tokens so far: the proposer's, then the forced text's."""
    s = engine.stats
    return (
        s.proposer.drafted_tokens, s.proposer.accepted_tokens,
        s.forced.drafted_tokens, s.forced.accepted_tokens,
    )  # fmt: skip


def side_table(sides: list[Side]) -> str:
    from benchmarks.machine import markdown_table

    base = sides[0].tok_s
    rows = [
        [
            s.name, str(s.requests), str(s.tokens), f"{s.tok_s:.1f}", f"{s.tok_s / base:.2f}x",
            f"{s.lookup_accepted}/{s.lookup_drafted}", f"{s.forced_accepted}/{s.forced_drafted}",
            f"{s.valid}/{s.requests}",
        ]
        for s in sides
    ]  # fmt: skip
    header = [
        "side", "requests", "tokens", "e2e tok/s", "/ off", "lookup accepted/drafted",
        "forced accepted/drafted", "valid JSON",
    ]  # fmt: skip
    return markdown_table(header, rows)


def main() -> None:
    from benchmarks.machine import machine_info, machine_lines

    args = parse_args()
    info = machine_info("benchmarks.bench_structured", sys.argv[1:])
    import torch

    torch.set_num_threads(args.threads)
    engines = {
        "off": build(0, args.threads, silent=False),
        "forced only": build(args.speculate, args.threads, silent=True),
        "lookup + forced": build(args.speculate, args.threads, silent=False),
    }
    compile_ms = compile_times(engines["off"])
    sides = run_sides(engines, args.repeats)
    print(machine_lines(info) + "\n\n" + side_table(sides))
    print("\nCompile (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in compile_ms.items()))
    cost = mask_cost(engines["off"], args.mask_concurrency) if args.mask_concurrency else None
    if cost is not None:
        print(
            f"\nThe mask at concurrency {cost['concurrency']} (speculation off): "
            f"{1000 * cost['mask_s']:.0f} ms of {cost['wall_s']:.1f} s of steps "
            f"({100 * cost['mask_share']:.1f} %), {cost['mask_us_per_row']:.0f} us per row, "
            f"{cost['tokens']} tokens in {cost['steps']} steps"
        )
    if args.json:
        data = {
            "machine": info,
            "sides": [asdict(s) for s in sides],
            "compile_ms": compile_ms,
            "mask_cost": cost,
        }
        Path(args.json).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
