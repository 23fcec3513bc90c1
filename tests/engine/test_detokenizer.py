"""Incremental detokenization equals a one-shot decode; stop strings cut and hold back."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specserve.engine.detokenizer import IncrementalDetokenizer, find_stop, held_back


def tokenizer(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def test_stream_equals_full_decode(tiny_llama: Path) -> None:
    tok = tokenizer(tiny_llama)
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(3, len(tok)) for _ in range(rng.randint(1, 30))]
        detok = IncrementalDetokenizer(tok)
        text = "".join(detok.push(t) for t in ids) + detok.flush()
        assert text == tok.decode(ids, skip_special_tokens=True)


def test_stop_string_is_cut_and_never_streamed(tiny_llama: Path) -> None:
    tok = tokenizer(tiny_llama)
    ids = tok.encode("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, stops=("fox jumps",))
    pieces = []
    for t in ids:
        pieces.append(detok.push(t))
        if detok.stopped:
            break
    assert detok.stopped
    assert "".join(pieces) + detok.flush() == "The quick brown "


def test_pure_helpers() -> None:
    assert find_stop("abc stop def stop", ("stop",), 0) == 4
    assert find_stop("abc stop", ("stop",), 5) is None
    assert held_back("hello wor", ("world", "xyz")) == 3
    assert held_back("hello", ("world",)) == 0


class CharTokenizer:
    """Token i decodes to the character chr(i): one character per token, no merges."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


def naive_held_back(text: str, stops: tuple[str, ...]) -> int:
    return max(
        (n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])),
        default=0,
    )


def test_held_back_matches_the_definition() -> None:
    rng = random.Random(1)
    for _ in range(2000):
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        stops = tuple(
            "".join(rng.choice("ab") for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(1, 3))
        )
        assert held_back(text, stops) == naive_held_back(text, stops), (text, stops)


def cut_at_first_stop(text: str, stops: tuple[str, ...]) -> str:
    """The text up to the first stop to complete as characters arrive (earliest start among
    those completing at the same character)."""
    for k in range(1, len(text) + 1):
        hits = [i for s in stops if (i := text[:k].find(s)) >= 0]
        if hits:
            return text[: min(hits)]
    return text


def test_streamed_text_is_cut_at_the_first_stop() -> None:
    rng = random.Random(2)
    for _ in range(500):
        text = "".join(rng.choice("abc") for _ in range(rng.randint(1, 40)))
        stops = tuple(
            "".join(rng.choice("abc") for _ in range(rng.randint(1, 5))) for _ in range(2)
        )
        detok = IncrementalDetokenizer(CharTokenizer(), stops)
        out = ""
        for c in text:
            out += detok.push(ord(c))
            if detok.stopped:
                break
        out += detok.flush()
        assert out == cut_at_first_stop(text, stops), (text, stops)


def test_stop_scan_per_token_does_not_grow_with_the_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The characters handed to the stop scans per token stay under the longest stop plus a
    token's text, at 20k characters of output as at 300 (counted, not timed)."""
    from specserve.engine import detokenizer

    scanned: list[int] = []

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(text: str, *args: Any) -> Any:
            scanned.append(len(text))
            return fn(text, *args)

        return wrapper

    monkeypatch.setattr(detokenizer, "held_back", counted(detokenizer.held_back))
    monkeypatch.setattr(detokenizer, "find_stop", counted(detokenizer.find_stop))
    stop = "x" * 255 + "!"  # the output keeps growing into it and never ends it
    detok = detokenizer.IncrementalDetokenizer(CharTokenizer(), (stop, "y" * 256))
    released = "".join(detok.push(ord("x")) for _ in range(20_000))
    assert not detok.stopped
    assert len(released) == 20_000 - 255
    assert max(scanned) <= 256
