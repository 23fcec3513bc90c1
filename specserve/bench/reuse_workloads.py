"""Built-in workloads where requests repeat what *other* requests said, from offline text.

- ``code-edit-multiturn`` (chat, conversations): a stdlib module edited over several turns, each
  turn asking for one more concrete edit to the file *as the model last wrote it* (the request
  carries the previous reply: `WorkloadItem.follows`). Every reply is the whole file again, so
  each turn repeats the previous turn's output.
- ``doc-qa`` (chat): several questions over the same set of Lee news articles, asked one after
  another by different users: summaries, quotes, and the same question rephrased, so answers
  repeat each other as well as the documents.

Both are deterministic for a given ``(n, seed)``; ``n`` counts requests (turns).
"""

from __future__ import annotations

import random

from specserve.bench.code_edits import CodeEdit, plan_edits, stdlib_sources
from specserve.bench.workload_items import MAX_PROMPT_CHARS, ChatMessage, WorkloadItem
from specserve.bench.workload_text import article_entities, lee_articles

TURNS = 3  # turns per code-edit conversation
FILE_ASK = "Make no other changes. Output the full updated file in a single ```python code block."


def _distinct_targets(edits: list[CodeEdit], rng: random.Random, n: int) -> list[CodeEdit]:
    """n edits touching n different names (a renamed function is not then given a docstring
    under its old name), in a seeded order."""
    order = list(edits)
    rng.shuffle(order)
    picked: list[CodeEdit] = []
    for edit in order:
        if all(edit.target != p.target for p in picked):
            picked.append(edit)
    return picked[:n]


def build_code_edit_multiturn(n: int, seed: int) -> list[WorkloadItem]:
    rng = random.Random(seed)
    files = [(p, s) for p, s in stdlib_sources() if len({e.target for e in plan_edits(s)}) >= TURNS]
    rng.shuffle(files)
    items: list[WorkloadItem] = []
    for conv in range(-(-n // TURNS)):
        path, source = files[conv % len(files)]
        previous = None
        for turn, edit in enumerate(_distinct_targets(plan_edits(source), rng, TURNS)):
            if turn == 0:
                ask = f"Here is the Python module `{path}`:\n\n```python\n{source}```\n\n"
            else:
                ask = "Now, in the file as you last wrote it: "
            item = WorkloadItem(
                f"code-edit-multiturn-{conv:04d}.{turn}:{path}",
                "code-edit-multiturn",
                messages=(ChatMessage("user", f"{ask}{edit.instruction} {FILE_ASK}"),),
                follows=previous,
            )
            items.append(item)
            previous = item.id
    return items[:n]


DOCS_PER_SET = 3
QUESTIONS_PER_SET = 6
_REPHRASE = ("Quick question about these documents: ", "I was asked this too, please help: ")


def _document_sets(rng: random.Random) -> list[list[tuple[int, str]]]:
    """Disjoint sets of Lee articles that fit one prompt together with a question."""
    articles = [(k, a) for k, a in lee_articles() if 400 < len(a) < 1400]
    rng.shuffle(articles)
    sets, current = [], []
    for article in articles:
        current.append(article)
        if len(current) == DOCS_PER_SET:
            if sum(len(a) for _, a in current) < MAX_PROMPT_CHARS - 600:
                sets.append(current)
            current = []
    return sets


def _questions(docs: list[tuple[int, str]], rng: random.Random) -> list[str]:
    pool = []
    for j, (_, text) in enumerate(docs, start=1):
        pool.append(f"Summarise document [{j}] in two sentences.")
        entities = article_entities(text)
        if entities:
            pool.append(
                f"Quote the sentence from document [{j}] that mentions {rng.choice(entities)}."
            )
    pool.append("Which of the documents is about sport, if any? Answer with its number.")
    rng.shuffle(pool)
    first = pool[: QUESTIONS_PER_SET - len(_REPHRASE)]
    again = [prefix + q for prefix, q in zip(_REPHRASE, first, strict=False)]
    return first + again


def build_doc_qa(n: int, seed: int) -> list[WorkloadItem]:
    rng = random.Random(seed)
    sets = _document_sets(rng)
    items = []
    for s in range(-(-n // QUESTIONS_PER_SET)):
        docs = sets[s % len(sets)]
        body = "\n\n".join(f"[{j}] {text}" for j, (_, text) in enumerate(docs, start=1))
        keys = ",".join(str(k) for k, _ in docs)
        for q, question in enumerate(_questions(docs, rng)):
            content = f"Answer using only these documents.\n\n{body}\n\nQuestion: {question}"
            items.append(
                WorkloadItem(
                    f"doc-qa-{s:04d}.{q}:lee/{keys}",
                    "doc-qa",
                    messages=(ChatMessage("user", content),),
                )
            )
    return items[:n]
