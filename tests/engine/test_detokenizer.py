"""Incremental detokenization equals a one-shot decode; stop strings cut and hold back."""

from __future__ import annotations

import random
from pathlib import Path

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
