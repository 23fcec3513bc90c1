"""llguidance against xgrammar on the embedded model's tokenizer: the cost of a JSON-schema mask.

One thread (torch, the compilers). Per library: the tokenizer's conversion (once); per schema,
the compile (a fresh compiler, nothing cached: xgrammar's `GrammarCompiler(max_threads=1,
cache_enabled=False)`; the grammar built and a matcher made), then walks along a fixed valid
instance of the schema, tokenized with our tokenizer and ended by EOS: the mask timed at every
position, then the instance's token consumed. The first walk, right after the compile, is cold
(in brackets: the first mask, the cold walk's total with the compile, its mean mask), then
`--repeats` warm walks after a reset (per schema, their mean; pooled, p50/p99/mean). Schemas:
bench_structured's four ("bounded": strings at most 60 characters, arrays at most 6 items), the
same without those bounds, a tool call; JSON with separators `", "` and `": "`, no other
whitespace, as the server generates it. llguidance's masks: `compute_logit_bias` (a byte per
token, what the server uses), `compute_bitmask` (a bit per token, as bytes) and
`fill_next_token_bitmask` into an int32 tensor, like for like with xgrammar's. Installed size:
the files of the library and of what it adds to specserve's dependencies (wheel sizes from
`--wheels DIR`, a `pip download` of them).

Usage (repo root, a venv with both libraries): python -m benchmarks.bench_grammar_libs
    [--repeats 10] [--wheels DIR] [--json FILE] [--md FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.structured_docs import DOCS

TOOL: dict[str, Any] = {"type": "object", "properties": {
    "name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {
        "location": {"type": "string"},
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["location", "date", "unit", "days"], "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False}  # fmt: skip
INSTANCES: list[dict[str, Any]] = [
    {"invoice_number": 2291, "seller": "Harbour Lane Bakery", "buyer": "Clifftop Guest House",
     "date": "14 March", "items": [
         {"product": "sourdough loaf", "quantity": 40, "unit_price": 3.2},
         {"product": "rye loaf", "quantity": 12, "unit_price": 2.8}], "payment_days": 14},
    {"organisation": "Ferndale Allotment Society", "date": "2 June", "attendees": [
        {"name": "Margaret Oyelaran", "role": "chair"},
        {"name": "Tomasz Wierzbicki", "role": "treasurer"},
        {"name": "Ines Carvalho", "role": "member"}], "balance_pounds": 412,
     "actions": ["replace the north gate lock before July",
                 "Ines Carvalho to order two water butts"],
     "next_meeting": "7 July at the pavilion"},
    {"reporter": "Priya Natarajan", "product": "Ledgerly desktop app", "version": "4.7.1",
     "platform": "Windows 11", "summary": "export freezes the window above 10,000 rows",
     "expected": "a CSV file", "actual": "no response for two minutes", "severity": "high",
     "reproducible": True},
    {"title": "Barley and leek broth", "servings": 4, "ingredients": [
        {"name": "leek", "amount": "2"}, {"name": "pearl barley", "amount": "100 g"},
        {"name": "carrot", "amount": "1"}, {"name": "vegetable stock", "amount": "1.2 litres"},
        {"name": "bay leaf", "amount": "1"}], "total_minutes": 50, "vegetarian": True},
]  # fmt: skip
TOOL_CALL: dict[str, Any] = {"name": "get_weather", "arguments": {
    "location": "Porto, Portugal", "date": "2026-12-02", "unit": "celsius", "days": 3}}  # fmt: skip
LLG_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
Walker = tuple[Callable[[], object], Callable[[int], bool], Callable[[], object]]
Make = Callable[[dict[str, Any], str], Walker]  # (schema, mask) -> mask, consume, reset


def unbounded(node: Any) -> Any:
    """`node` without maxLength and maxItems."""
    if isinstance(node, dict):
        return {k: unbounded(v) for k, v in node.items() if k not in ("maxLength", "maxItems")}
    return [unbounded(v) for v in node] if isinstance(node, list) else node


SCHEMAS: list[tuple[str, dict[str, Any], dict[str, Any]]]
SCHEMAS = [(f"doc {i}", s, x) for i, ((_, s), x) in enumerate(zip(DOCS, INSTANCES, strict=True))]
SCHEMAS += [(f"{n}, unbounded", unbounded(s), x) for n, s, x in SCHEMAS]
SCHEMAS += [("tool call", TOOL, TOOL_CALL)]


def llg_setup(tok: Any, eos: int) -> tuple[Make, float]:
    import llguidance.hf
    import llguidance.torch
    from llguidance import LLMatcher, LLParserLimits

    started = time.perf_counter()
    ll_tok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok), eos_token=[eos])
    conversion_ms = 1000 * (time.perf_counter() - started)
    limits = LLParserLimits(initial_lexer_fuel=200_000, step_lexer_fuel=50_000)
    bitmask = llguidance.torch.allocate_token_bitmask(1, len(tok))

    def make(schema: dict[str, Any], how: str) -> Walker:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=LLG_JSON)  # type: ignore[arg-type]
        m = LLMatcher(ll_tok, grammar, log_level=0, limits=limits)
        if m.is_error():
            raise ValueError(m.get_error())
        mask: Callable[[], object] = {
            "compute_logit_bias": m.compute_logit_bias, "compute_bitmask": m.compute_bitmask,
            "fill_next_token_bitmask": lambda: llguidance.torch.fill_next_token_bitmask(m, bitmask),
        }[how]  # fmt: skip
        return mask, lambda t: bool(m.consume_token(t)) and not m.is_error(), m.reset

    return make, conversion_ms


def xgr_setup(tok: Any, eos: int) -> tuple[Make, float]:
    import xgrammar as xgr

    started = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[eos])
    conversion_ms = 1000 * (time.perf_counter() - started)
    bitmask = xgr.allocate_token_bitmask(1, len(tok))

    def make(schema: dict[str, Any], how: str) -> Walker:
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        compiled = compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(", ", ": ")
        )
        m = xgr.GrammarMatcher(compiled)
        return lambda: m.fill_next_token_bitmask(bitmask), m.accept_token, m.reset

    return make, conversion_ms


def walk(walker: Walker, tokens: list[int]) -> list[float]:
    """Microseconds per mask along `tokens`; ValueError if one is refused."""
    mask, consume, _ = walker
    times = []
    for i, t in enumerate(tokens):
        started = time.perf_counter_ns()
        mask()
        times.append((time.perf_counter_ns() - started) / 1000)
        if not consume(t):
            raise ValueError(f"token {i} of {len(tokens)} ({t}) refused")
    return times


def summary(us: list[float]) -> dict[str, float]:
    q = statistics.quantiles(us, n=100, method="inclusive")
    return {"p50": statistics.median(us), "p99": q[98], "mean": statistics.fmean(us)}


def measure(make: Make, hows: list[str], seqs: list[list[int]], repeats: int) -> dict[str, Any]:
    """Per schema: the compile's times (under the first of `hows`), per mask its cold walk's
    mean and warm p50/p99/mean us, or the error; per mask, the warm masks pooled."""
    res: dict[str, Any] = {n: {} for n, _, _ in SCHEMAS} | {"pooled": {}}
    for how in hows:
        pooled: dict[str, list[float]] = {"bounded": [], "unbounded": []}
        for (name, schema, _), seq in zip(SCHEMAS, seqs, strict=True):
            try:
                started = time.perf_counter()
                walker = make(schema, how)
                compile_ms = 1000 * (time.perf_counter() - started)
                cold, warm = walk(walker, seq), []
                for _ in range(repeats):
                    walker[2]()  # reset
                    warm += walk(walker, seq)
            except Exception as exc:  # refused: the schema or the instance
                res[name].setdefault("errors", {})[how] = f"{type(exc).__name__}: {exc}"
                continue
            if how == hows[0]:
                times = {"compile_ms": compile_ms, "first_mask_ms": cold[0] / 1000}
                res[name].update(times, cold_walk_ms=compile_ms + sum(cold) / 1000)
            res[name][how] = {"cold_mean": statistics.fmean(cold), **summary(warm)}
            pooled["bounded" if "maxLength" in json.dumps(schema) else "unbounded"] += warm
        res["pooled"][how] = {k: summary(v) for k, v in pooled.items() if v}
    return res


def install_size(lib: str, wheels: Path | None) -> dict[str, Any]:
    """MB installed (and the wheel's MB, if in `wheels`) of `lib` and of each distribution it
    adds to the closure of specserve's requirements (installed distributions only)."""
    from packaging.requirements import Requirement

    def requires(name: str) -> list[str]:
        reqs = [Requirement(r) for r in metadata.requires(name) or []]
        return [r.name for r in reqs if not r.marker or r.marker.evaluate({"extra": ""})]

    def closure(names: list[str]) -> set[str]:
        seen: set[str] = set()
        while names:
            name = names.pop().lower().replace("_", "-")
            if name not in seen:
                try:
                    names += requires(name)
                    seen.add(name)
                except metadata.PackageNotFoundError:
                    pass
        return seen

    def size(name: str) -> dict[str, float | None]:
        files = [Path(str(f.locate())) for f in metadata.distribution(name).files or []]
        stem = name.replace("-", "_") + "-"
        whl = [w for w in (wheels.glob("*.whl") if wheels else []) if w.name.startswith(stem)]
        return {"installed_mb": sum(f.stat().st_size for f in files if f.is_file()) / 1e6,
                "wheel_mb": whl[0].stat().st_size / 1e6 if whl else None}  # fmt: skip

    added = closure([lib]) - closure([r for r in requires("specserve") if r != lib]) - {lib}
    return {"version": metadata.version(lib), **size(lib), "added": {d: size(d) for d in added}}


def report(info: dict[str, Any], libs: dict[str, Any], hows: dict[str, list[str]],
           seqs: list[list[int]]) -> str:  # fmt: skip
    from benchmarks.machine import machine_lines, markdown_table

    ran = {k: v for k, v in libs.items() if "missing" not in v}
    missing = "".join(f"; {k} missing ({v['missing']})" for k, v in libs.items() if k not in ran)
    out = [machine_lines(info), f"- 1-min load at the end {info['loadavg_1m_end']:.2f}",
           "- " + ", ".join(f"{k} {v['install']['version']}" for k, v in ran.items()) + missing,
           "", __doc__.split("\n\n")[1], ""]  # fmt: skip

    def mb(a: dict[str, Any]) -> str:
        wheel = "?" if a["wheel_mb"] is None else f"{a['wheel_mb']:.1f}"
        return f"{a['installed_mb']:.1f} ({wheel})"

    rows = [[k, f"{v['tokenizer_ms']:.0f}", mb(v["install"]), ", ".join(
        f"{d} {mb(a)}" for d, a in sorted(v["install"]["added"].items())) or "nothing"]
        for k, v in ran.items()]  # fmt: skip
    head = ["library", "tokenizer conversion ms", "installed MB (wheel MB)", "adds: the same"]
    out += [markdown_table(head, rows), ""]
    cols = [(k, h) for k in ran for h in hows[k]]
    rows = []
    for (n, _, _), seq in zip(SCHEMAS, seqs, strict=True):
        rs = {k: v["schemas"][n] for k, v in ran.items()}
        cells = [f"{r['compile_ms']:.1f} ({r['first_mask_ms']:.2f}; {r['cold_walk_ms']:.1f})"
                 if "compile_ms" in r else "refused" for r in rs.values()]  # fmt: skip
        cells += [f"{rs[k][h]['mean']:.1f} ({rs[k][h]['cold_mean']:.1f})" if h in rs[k]
                  else "refused" for k, h in cols]  # fmt: skip
        rows.append([n, str(len(seq)), *cells])
    head = ["schema", "tokens"] + [f"{k} compile ms (first mask; cold walk)" for k in ran]
    out += [markdown_table(head + [f"{k} {h} us" for k, h in cols], rows), ""]
    rows = [[f"{k} {h}", g] + [f"{s[q]:.1f}" for q in ("p50", "p99", "mean")]
            for k, h in cols for g, s in ran[k]["schemas"]["pooled"][h].items()]  # fmt: skip
    out += [markdown_table(["mask", "schemas", "p50 us", "p99 us", "mean us"], rows)]
    errors = [f"- {k} {n}: {e}" for k, v in ran.items() for n, _, _ in SCHEMAS
              for e in v["schemas"][n].get("errors", {}).values()]  # fmt: skip
    return "\n".join(out + (["", "Refused:", *errors] if errors else []))


def main() -> None:
    from benchmarks.machine import machine_info

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10, help="warm walks per schema and mask")
    p.add_argument("--wheels", type=Path, default=None, help="the libraries' downloaded wheels")
    p.add_argument("--json", default=None)
    p.add_argument("--md", default=None)
    args = p.parse_args()
    info = machine_info("benchmarks.bench_grammar_libs", sys.argv[1:])
    import torch

    from specserve.models.loader import resolve_model_dir
    from specserve.models.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer(resolve_model_dir(None))
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    tok.get_vocab()  # warmed up, so that neither conversion pays for it
    texts = [json.dumps(x, separators=(", ", ": "), ensure_ascii=False) for _, _, x in SCHEMAS]
    seqs = [[*tok.encode(t, add_special_tokens=False), eos] for t in texts]
    setups = {"llguidance": llg_setup, "xgrammar": xgr_setup}
    hows = {"llguidance": ["compute_logit_bias", "compute_bitmask", "fill_next_token_bitmask"],
            "xgrammar": ["fill_next_token_bitmask"]}  # fmt: skip
    libs: dict[str, Any] = {}
    for lib, setup in setups.items():
        try:
            make, conversion_ms = setup(tok, eos)
        except ImportError as exc:
            libs[lib] = {"missing": f"{type(exc).__name__}: {exc}"}
            continue
        libs[lib] = {"tokenizer_ms": conversion_ms, "install": install_size(lib, args.wheels)}
        libs[lib]["schemas"] = measure(make, hows[lib], seqs, args.repeats)
    info["loadavg_1m_end"] = os.getloadavg()[0]
    text = report(info, libs, hows, seqs)
    print(text)
    if args.md:
        Path(args.md).write_text(f"# Grammar libraries: llguidance vs xgrammar\n\n{text}\n")
    if args.json:
        data = {"machine": info, "instances": texts, "libraries": libs}
        Path(args.json).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    main()
