"""Grammars in the engine: outputs stay inside them, speculation on and off emit the same tokens
under them (greedy and seeded, drafts really made and really rejected, forbidden drafts rejected
at the mask), beside unconstrained requests, and through preemption; the text a grammar forces
is drafted (and changes no token)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.bench_structured import Silent
from specserve.request import GrammarSpec, SamplingParams
from tests.engine.helpers import assert_no_kv_held, collect, make_engine, run_all
from tests.engine.observers import HoldSteps
from tests.engine.test_logits_processors import Insist

PHONE = GrammarSpec("regex", r"[0-9]{3}-[0-9]{4}")
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "colour": {"enum": ["red", "green", "blue"]},
    },
    "required": ["ok", "n", "colour"],
    "additionalProperties": False,
}
JSON = GrammarSpec("json_schema", json.dumps(SCHEMA))
# Prompts whose n-grams the proposer drafts from: some follow the grammar, most do not.
PROMPTS = [
    "The quick brown fox 123-4567 and 123-4567 and 123-",
    'def add(a, b): {"ok": true, "n": 5, "colour": "red"} {"ok": true, "n": 5, "colour": "red"}',
    "Speculative decoding proposes tokens and verifies them in one pass. Speculative decoding",
]
GREEDY = SamplingParams(max_new_tokens=48)
SEEDED = SamplingParams(max_new_tokens=48, temperature=0.9, seed=11)


def constrained(params: SamplingParams, grammar: GrammarSpec) -> SamplingParams:
    return SamplingParams(**{**params.__dict__, "grammar": grammar})


def texts(engine_dir: Path, outs: list[list[int]]) -> list[str]:
    from specserve.models.tokenizer import load_tokenizer

    tok = load_tokenizer(engine_dir)
    return [tok.decode(o, skip_special_tokens=True) for o in outs]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_outputs_stay_inside_the_grammar(tiny_llama: Path, params: SamplingParams) -> None:
    engine = make_engine(tiny_llama)
    phone = collect(engine, PROMPTS, constrained(params, PHONE))
    assert all(o.finish_reason == "eos" for o in phone)
    assert all(re.fullmatch(PHONE.source, t) for t in texts(tiny_llama, [o.tokens for o in phone]))
    for text in texts(tiny_llama, run_all(engine, PROMPTS, constrained(params, JSON))):
        value = json.loads(text)
        assert set(value) == {"ok", "n", "colour"} and value["colour"] in ("red", "green", "blue")
        assert isinstance(value["ok"], bool) and 0 <= value["n"] <= 99
    assert_no_kv_held(engine)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("grammar", [PHONE, JSON], ids=["regex", "json"])
def test_speculation_on_and_off_emit_the_same_tokens(
    tiny_llama: Path, params: SamplingParams, grammar: GrammarSpec
) -> None:
    p = constrained(params, grammar)
    want = run_all(make_engine(tiny_llama), PROMPTS, p)
    engine = make_engine(tiny_llama, speculate=3, proposer="ngram")
    assert run_all(engine, PROMPTS, p) == want
    stats = engine.stats.proposer
    assert stats.drafted_tokens > stats.accepted_tokens > 0  # drafted, some kept, some not
    assert_no_kv_held(engine)


def test_drafts_the_grammar_forbids_are_rejected(tiny_llama: Path) -> None:
    p = constrained(GREEDY, PHONE)
    want = run_all(make_engine(tiny_llama), PROMPTS, p)
    engine = make_engine(tiny_llama, speculate=3)
    letter = engine.tokenizer.encode("x", add_special_tokens=False)[0]
    engine.use_proposer(Insist(letter))  # every draft token: a letter, never in a phone number
    outs = collect(engine, PROMPTS, p)
    assert [o.tokens for o in outs] == want
    assert engine.stats.proposer.drafted_tokens > 0 and engine.stats.proposer.accepted_tokens == 0


def test_unconstrained_neighbours_and_preemption_change_nothing(tiny_llama: Path) -> None:
    plain = SamplingParams(max_new_tokens=48, ignore_eos=True)
    mixed = [constrained(GREEDY, JSON), plain, constrained(SEEDED, PHONE), plain]
    prompts = [PROMPTS[1], PROMPTS[0], PROMPTS[0], PROMPTS[2]]
    pairs = zip(prompts, mixed, strict=True)
    alone = [run_all(make_engine(tiny_llama), [t], [p])[0] for t, p in pairs]
    # 40 blocks of 4 tokens for four requests of up to ~130 tokens each: some are preempted.
    engine = make_engine(tiny_llama, num_blocks=40, speculate=3, proposer="ngram")
    assert run_all(engine, prompts, mixed) == alone
    assert engine.scheduler.num_preemptions > 0
    assert_no_kv_held(engine)


def test_an_invalid_grammar_is_refused_before_it_runs(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama)
    bad = constrained(GREEDY, GrammarSpec("json_schema", '{"type": "strin"}'))
    with pytest.raises(ValueError, match="invalid json schema"):
        engine.add_request("hi", bad)
    assert not engine.has_work()


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_forced_text_is_drafted_and_changes_nothing(
    tiny_llama: Path, params: SamplingParams
) -> None:
    p = constrained(params, JSON)
    want = run_all(make_engine(tiny_llama), PROMPTS, p)
    engine = make_engine(tiny_llama, speculate=4)
    engine.use_proposer(Silent())
    outs = collect(engine, PROMPTS, p)
    assert [o.tokens for o in outs] == want
    forced, lookup = engine.stats.forced, engine.stats.proposer
    assert forced.drafted_tokens >= forced.accepted_tokens > 0 and lookup.drafted_tokens == 0
    # A request's speculate: 0 turns forced drafts off too.
    off = make_engine(tiny_llama, speculate=4)
    off.use_proposer(Silent())
    assert run_all(off, PROMPTS, SamplingParams(**{**p.__dict__, "speculate": 0})) == want
    assert off.stats.forced.drafted_tokens == 0


def test_a_grammar_too_costly_to_follow_fails_only_its_request(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specserve.grammar

    plain = SamplingParams(max_new_tokens=24, ignore_eos=True)
    [alone] = run_all(make_engine(tiny_llama), [PROMPTS[2]], plain)
    engine = make_engine(tiny_llama, speculate=3, proposer="ngram")
    engine.grammars.compile(JSON)  # cached: compiling would refuse it with the clock at 0
    monkeypatch.setattr(specserve.grammar, "SLOW_MASK_S", 0.0)  # every mask is "slow"
    costly, neighbour = collect(
        engine, [PROMPTS[1], PROMPTS[2]], [constrained(GREEDY, JSON), plain]
    )
    assert costly.finish_reason == "error" and "too costly" in (costly.error or "")
    assert len(costly.tokens) < specserve.grammar.SLOW_MASKS  # failed within its first rows
    assert neighbour.finish_reason == "length" and neighbour.tokens == alone
    assert_no_kv_held(engine)


def test_forced_text_is_drafted_where_the_payoff_stopped_proposing(tiny_llama: Path) -> None:
    from specserve.speculation.objective import Rated
    from specserve.speculation.payoff import size_class

    p = constrained(GREEDY, JSON)
    static = make_engine(tiny_llama, speculate=4)
    static.use_proposer(Silent())
    want = collect(static, PROMPTS, p)
    engine = make_engine(tiny_llama, speculate=4, policy="adaptive")
    engine.use_proposer(Silent())
    policy = engine.res.policy
    assert policy is not None
    nothing = Rated([], 1.0, 0.001, 1.0, 0.001)
    for batch in (1, 2, 3):  # proposing has cost its time at every batch size this runs at
        for _ in range(policy.payoff.min_steps):
            policy.payoff.record(batch, 1, 0.01, nothing)
        assert not policy.payoff.allows(batch)
    assert {size_class(b) for b in (1, 2, 3)} == set(policy.payoff.classes)
    outs = collect(engine, PROMPTS, p)
    assert [o.tokens for o in outs] == [o.tokens for o in want]
    assert policy.stats.unpaid_steps > 0
    # every forced span drafted as with the static policy (the payoff gates proposing only)
    assert engine.stats.forced.drafted_tokens == static.stats.forced.drafted_tokens > 0


def test_the_engine_thread_never_compiles(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54 item 2: a grammar evicted from the cache (LRU) between a request's prepare and
    its admission was compiled again on the step thread, under the engine's lock. The compiled
    grammar now travels with the request's parameters."""
    import specserve.grammar

    p = constrained(GREEDY, PHONE)
    [want] = run_all(make_engine(tiny_llama), [PROMPTS[0]], p)
    engine = make_engine(tiny_llama)
    ids, prepared = engine.prepare(PROMPTS[0], p)
    engine.grammars._compiled.clear()

    def refuse(spec: GrammarSpec) -> str:
        raise AssertionError("compiled on the engine's thread")

    monkeypatch.setattr(specserve.grammar, "grammar_text", refuse)
    rid = engine.add_prepared(ids, prepared)
    tokens: list[int] = []
    while engine.has_work():
        for out in engine.step():
            assert out.request_id == rid and out.error is None, out.error
            tokens += out.new_token_ids
    assert tokens == want
    assert_no_kv_held(engine)


def test_grammar_builds_take_turns_with_steps(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54 item 2: llguidance holds the GIL through a grammar's build, and builds back to
    back beside a plain stream kept its steps from the GIL (a 11 ms step took 130-320 ms). An
    AsyncEngine's builds now wait, while it has work, for a step to finish since the last one."""
    import asyncio
    import threading
    import time

    import specserve.engine.async_engine as async_engine_module
    import specserve.grammar
    from specserve.engine.async_engine import AsyncEngine

    monkeypatch.setattr(async_engine_module, "PACE_TIMEOUT_S", 600.0)  # only a step lets it go
    engine = make_engine(tiny_llama)
    held, built = HoldSteps(engine), threading.Event()
    stepping, release = held.stepping, held.release
    real_text = specserve.grammar.grammar_text

    def text(spec: GrammarSpec) -> str:
        built.set()
        return real_text(spec)

    engine.observers.add(held)
    monkeypatch.setattr(specserve.grammar, "grammar_text", text)
    runner = AsyncEngine(engine)

    async def generate() -> None:
        async for _ in runner.generate(PROMPTS[2], SamplingParams(max_new_tokens=4)):
            pass

    request = threading.Thread(target=lambda: asyncio.run(generate()))
    request.start()
    assert stepping.wait(60)
    compile_ = threading.Thread(target=engine.grammars.compile, args=(PHONE,))
    compile_.start()
    deadline = time.monotonic() + 60  # a bound on failure only
    while not runner._stepped._waiters and not built.is_set() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.001)
    early = built.is_set()
    release.set()
    compile_.join()
    request.join()
    asyncio.run(runner.shutdown())
    assert not early, "a build ran while a step was under way"
    assert built.is_set()
