"""Incremental detokenization equals a one-shot decode; stop strings cut and hold back."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from specserve.engine.detokenizer import IncrementalDetokenizer, StopMatcher, failure


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


def test_failure_function() -> None:
    assert failure("abab") == [0, 0, 1, 2]
    assert failure("aabaaab") == [0, 1, 0, 1, 2, 2, 3]


class CharTokenizer:
    """Token i decodes to the character chr(i): one character per token, no merges."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


def naive_held_back(text: str, stops: tuple[str, ...]) -> int:
    return max(
        (n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])),
        default=0,
    )


def test_matcher_holds_back_the_longest_tail_that_begins_a_stop() -> None:
    rng = random.Random(1)
    for _ in range(1000):
        stops = tuple(
            "".join(rng.choice("ab") for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(1, 3))
        )
        matcher, text = StopMatcher(stops), ""
        for _ in range(rng.randint(1, 8)):
            piece = "".join(rng.choice("ab") for _ in range(rng.randint(1, 3)))
            hit = matcher.feed(piece)
            if hit is not None:
                assert any((text + piece)[len(text) + hit :].startswith(s) for s in stops)
                break
            text += piece
            assert matcher.held == naive_held_back(text, stops), (text, stops)


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


class CountingStop(str):
    """A stop string that counts the characters the matcher reads from it."""

    reads = 0

    def __getitem__(self, key: Any) -> Any:
        CountingStop.reads += 1
        return str.__getitem__(self, key)


def test_stop_matching_per_token_does_not_grow_with_the_output() -> None:
    """Four 256-character stops built to make a naive tail scan quadratic: the characters the
    matcher compares stay within a constant per output character, at 20k characters as at 2k
    (counted, not timed)."""
    stops = tuple(CountingStop("a" * 128 + b + "a" * 127) for b in "bcde")
    detok = IncrementalDetokenizer(CharTokenizer(), stops)
    per_window = []
    for _ in range(10):
        before = CountingStop.reads
        for _ in range(2000):
            detok.push(ord("a"))
        per_window.append(CountingStop.reads - before)
    assert max(per_window) <= 3 * 2000 * len(stops), per_window
    assert not detok.stopped and len(detok.text) == 128  # held back: it could still be a stop


def test_the_locked_tokenizer_decodes_through_rust_as_transformers_would(tiny_llama: Path) -> None:
    """The step thread's decode skips transformers' wrapper only where the text is the same."""
    from specserve.engine.tokenizer import _direct_decoder, locked

    inner = tokenizer(tiny_llama)
    tok = locked(inner)
    assert _direct_decoder(inner) is not None  # the fast path is the one under test
    rng = random.Random(1)
    special = list(inner.all_special_ids)
    for _ in range(200):
        ids = [rng.randrange(len(inner)) for _ in range(rng.randint(0, 8))]
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(special))
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == inner.decode(
                ids, skip_special_tokens=skip
            )
    inner.clean_up_tokenization_spaces = True  # transformers would post-process: no shortcut
    assert _direct_decoder(inner) is None
