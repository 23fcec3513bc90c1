"""The grammar constraint alone (specserve/grammar.py): compiled once per spec, invalid and
pathological grammars refused, and a processor whose mask is a function of the history only."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from specserve.grammar import GrammarProcessor, Grammars
from specserve.grammar_limits import regex_positions
from specserve.models.tokenizer import load_tokenizer
from specserve.request import GrammarSpec, SamplingParams

PHONE = GrammarSpec("regex", r"[0-9]{3}-[0-9]{4}")
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "green"]}},
    "required": ["ok", "colour"],
    "additionalProperties": False,
}


EXPLODING = {"type": "object", "properties": {"id": {"type": "string", "pattern": "[0-9]{10001}"}}}


def nested(depth: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.fixture(scope="module")
def grammars(tiny_llama: Path) -> Grammars:
    tok = load_tokenizer(tiny_llama)
    return Grammars(tok, len(tok), frozenset({tok.convert_tokens_to_ids("<|im_end|>")}))


def allowed(proc: GrammarProcessor, history: list[int], vocab: int) -> set[int]:
    row = proc(history, torch.zeros(vocab))
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def encode(grammars: Grammars, text: str) -> list[int]:
    return list(grammars._hf.encode(text, add_special_tokens=False))


def test_the_mask_follows_the_history_and_rolls_back(grammars: Grammars) -> None:
    vocab = grammars.vocab_size
    prompt = [5, 6, 7]
    proc = grammars.processor(PHONE, len(prompt))
    digits = set(encode(grammars, "0123456789"))
    first = allowed(proc, prompt, vocab)
    assert first and all(grammars._hf.decode([t])[0].isdigit() for t in first)
    text = encode(grammars, "123-4567")
    end = allowed(proc, prompt + text, vocab)
    assert end == set(grammars.eos_ids)  # the regex is complete: only EOS
    # Back to an earlier history (a rejected draft): the same mask as a fresh processor's.
    again = allowed(proc, prompt, vocab)
    assert again == first == allowed(grammars.processor(PHONE, 3), prompt, vocab)
    assert digits & first


def test_a_forbidden_draft_token_leaves_later_rows_unmasked(grammars: Grammars) -> None:
    vocab = grammars.vocab_size
    proc = grammars.processor(PHONE, 0)
    letter = encode(grammars, "x")
    row = proc(letter, torch.zeros(vocab))
    assert torch.isfinite(row).all()  # a row after a forbidden token: left as it came
    assert not proc.advance(letter) and proc.consumed == []
    assert allowed(proc, encode(grammars, "1"), vocab)  # and the matcher still works


def test_compiled_once_per_spec(grammars: Grammars) -> None:
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    grammars.compile(spec)
    first = grammars._compiled[spec]
    grammars.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    assert grammars._compiled[spec] is first


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GrammarSpec("json_schema", '{"type": "strin"}'), "invalid json schema"),
        (GrammarSpec("json_schema", "[1, 2]"), "must be a JSON object"),
        (GrammarSpec("json_schema", "{nope"), "not valid JSON"),
        (GrammarSpec("regex", "(a"), "invalid regex"),
        (GrammarSpec("lark", "start: foo"), "invalid lark"),
        # nested past what is parsed at all (issue 54 item 4; llguidance's own recursion limit
        # refused it before): refused before parsing, not compiled for long
        (GrammarSpec("json_schema", json.dumps(nested(200))), "nested over 100 levels"),
        (GrammarSpec("json_schema", '{"not": {"type": "string"}}'), "Unimplemented keys"),
        # regexes built to explode: refused before anything is compiled
        (GrammarSpec("regex", "(x{1000}){1000}"), "unrolls to 1000000 positions"),
        (GrammarSpec("json_schema", json.dumps(EXPLODING)), "unrolls to 10001 positions"),
        (GrammarSpec("json_schema", '{"patternProperties": {"(a{99}){999}": {}}}'), "unrolls"),
        # a schema inside a Lark grammar (a tool's parameters under tool_choice "auto")
        (
            GrammarSpec(
                "lark", f"start: call | text\ncall: %json {json.dumps(EXPLODING)}\ntext: /a+/\n"
            ),
            "unrolls to 10001 positions",
        ),
    ],
)
def test_invalid_and_pathological_grammars_are_refused(
    grammars: Grammars, spec: GrammarSpec, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        grammars.compile(spec)


@pytest.mark.parametrize(
    ("pattern", "positions"),
    [
        (r"[0-9]{3}-[0-9]{4}", 8),
        (r"(x{100}){100}", 10_000),
        (r"[a-z]{1,50}(\.[a-z]{1,50}){1,20}", 50 + 20 * 51),
        (r"(?:ab|cd){2}(?P<n>x)*", 2 * 4 + 1),
        (r"[]x]{4}\p{L}{3}x{,7}y{2,}", 4 + 3 + 7 + 2),
    ],
)
def test_a_regex_unrolls_to_its_counted_repeats(pattern: str, positions: int) -> None:
    assert regex_positions(pattern) == positions


def test_a_grammar_whose_masks_are_too_slow_is_refused_at_compile(
    grammars: Grammars, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specserve.grammar

    monkeypatch.setattr(specserve.grammar, "SLOW_MASK_S", 0.0)
    with pytest.raises(ValueError, match="too costly to follow"):
        grammars.compile(GrammarSpec("regex", "[a-c]{5}"))


def test_grammar_params_are_checked() -> None:
    with pytest.raises(ValueError, match="grammar kind"):
        GrammarSpec("xml", "<a/>")
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(grammar=PHONE, ignore_eos=True)


def test_forced_text_is_drafted_as_its_tokens(grammars: Grammars) -> None:
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    proc = grammars.processor(spec, 0)
    forced = proc.forced([], 16)
    assert grammars._hf.decode(forced) == '{"ok": '  # key order and separators are fixed
    assert proc.forced([], 2) == forced[:2]
    after = encode(grammars, '{"ok": true')
    assert grammars._hf.decode(proc.forced(after, 16)) == ', "colour": "'
    assert proc.forced(after, 0) == []


def blocking_compile(
    monkeypatch: pytest.MonkeyPatch, slow: GrammarSpec
) -> tuple[threading.Event, threading.Event, list[GrammarSpec]]:
    """Compiling `slow` stops, once entered, until released: (entered, release, every spec
    that reached the compiler)."""
    import specserve.grammar

    entered, release = threading.Event(), threading.Event()
    built: list[GrammarSpec] = []
    real = specserve.grammar.grammar_text

    def held(spec: GrammarSpec) -> str:
        built.append(spec)
        if spec == slow:
            entered.set()
            release.wait()
        return real(spec)

    monkeypatch.setattr(specserve.grammar, "grammar_text", held)
    return entered, release, built


def test_a_compile_holds_up_nothing_else(
    grammars: Grammars, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54 item 2: a compile held the one lock the engine's thread takes to build a
    sequence's constraint, so every stream waited for any client's schema. Now a compile in
    progress holds up neither the engine's copies nor requests for compiled specs; those
    waiting for that same spec share its one compile (other specs' builds queue behind it)."""
    ready = grammars.compile(PHONE)
    slow = GrammarSpec("regex", "[a-z]{3}-[0-9]{2}")
    entered, release, built = blocking_compile(monkeypatch, slow)
    first = threading.Thread(target=grammars.compile, args=(slow,))
    first.start()
    assert entered.wait(60)
    again: list[GrammarSpec] = []
    second = threading.Thread(target=lambda: again.append(grammars.compile(slow)))
    second.start()
    done = threading.Event()

    def others() -> None:
        grammars.processor(ready, 0)  # as the engine's thread builds a constraint
        grammars.compile(PHONE)  # another request for a compiled spec
        done.set()

    threading.Thread(target=others, daemon=True).start()
    unblocked = done.wait(60)  # a bound on failure only: it is immediate when it passes
    release.set()
    first.join()
    second.join()
    assert unblocked, "a compile in progress held up the engine's copy or a compiled spec"
    assert built.count(slow) == 1 and again[0].compiled is grammars._compiled[slow].result()


def test_a_compiled_spec_is_copied_never_compiled_again(
    grammars: Grammars, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled grammar travels with the spec: evicted from the cache, it is not
    recompiled where the constraint is built (the engine's thread)."""
    import specserve.grammar

    ready = grammars.compile(GrammarSpec("regex", "[0-9]{4}"))
    assert ready.compiled is not None and ready == GrammarSpec("regex", "[0-9]{4}")
    grammars._compiled.clear()

    def refuse(spec: GrammarSpec) -> str:
        raise AssertionError("compiled again")

    monkeypatch.setattr(specserve.grammar, "grammar_text", refuse)
    proc = grammars.processor(ready, 0)
    first = allowed(proc, [], grammars.vocab_size)
    assert first and all(grammars._hf.decode([t])[0].isdigit() for t in first)
