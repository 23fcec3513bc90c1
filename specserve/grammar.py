"""Constrained decoding: a grammar (JSON schema, regex or Lark) as a mask on every scored row.

llguidance (MIT; a Rust core, no Python dependencies, ~8 MB installed) compiles a grammar against
the model's tokenizer and gives, at each position, the set of tokens that keep the text inside
the grammar. Chosen over xgrammar by measurement on the embedded model's 49k vocabulary
(benchmarks/bench_grammar_libs.py, docs/benchmarks.md): ~1 ms to compile a schema where
xgrammar takes ~0.9 s once strings have a maxLength (8 ms without), masks of 10-20 us (xgrammar
2-5 us without length bounds, a mean of 49 us with them), and 8 MB installed with no Python
dependencies where xgrammar pulls triton (1 GB) onto a CPU server.

`GrammarSpec` (request.py) is what a request asks for. `Grammars` compiles a spec once, under
llguidance's parser limits, so a pathological schema or regex is refused with ValueError (a 4xx)
instead of stalling whoever compiles it, and caches the compiled matcher per spec. Each sequence
gets a `GrammarProcessor` of its own: a copy of that matcher, and a logits processor (the hook
of request.py, applied to every row scored for the sequence, draft rows included).

The processor is a function of the row's history alone. It remembers the output tokens its
matcher has consumed; each call rolls the matcher back to the longest common prefix with the
row's output tokens and consumes the rest. Given the engine's `History` (a view of the sequence
and the row's drafts), it compares only what follows the committed tokens it has already
checked, since committed output never changes: a row costs O(new tokens + drafts), not
O(output). So rows of a draft consume the drafted tokens before
them, drafts rejected in one step are undone in the next, and a preempted sequence that is
recomputed replays the same states: the mask of a row never depends on what else ran. A draft
token the grammar forbids cannot be consumed; the rows after it are left unmasked and never
used, since verification stops at that token (the row before it was masked and cannot pick it).

JSON is generated with one fixed separator style (`", "`, `": "`, no other whitespace), so the
text between two values (`", "key": "`) is forced as a whole: the speculation issue's forced
drafts rely on it, and a client parsing the reply cannot tell.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict, abc
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import torch

from specserve.grammar_limits import (
    check_json_depth,
    check_regex,
    lark_schemas,
    schema_patterns,
)
from specserve.kernels.attention import mask_logits
from specserve.request import GrammarSpec, History

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 128  # compiled grammars kept (each a few hundred KB at most)
# llguidance's work limits, a fifth and a quarter of its defaults: a mask step stops at
# STEP_LEXER_FUEL (~14k per ms) and the lexer's build at INITIAL_LEXER_FUEL (~50k per ms); a
# grammar that runs out is in error and refused (compile) or its request fails (a step). The
# regex (x{1000}){1000} took 2.3-3.0 s over its first mask with the defaults, 0.36 s with these
# (measured beside other work), spent where the grammar is compiled, not in the engine's thread;
# its later masks still cost ~0.1 s each: SLOW_MASKS of them fail its request.
INITIAL_LEXER_FUEL = 200_000
# What the limits cannot bound, a clock does: a request whose masks take longer than this
# SLOW_MASKS rows in a row fails (its grammar is too costly to follow), so it cannot hold every
# other request's steps back for long. The clock is the thread's CPU time (llguidance computes
# a mask in the calling thread), so a busy machine that keeps the thread waiting for a core
# fails no request. A mask takes ~0.01-0.15 ms of CPU here.
SLOW_MASK_S = 0.05
SLOW_MASKS = 3
STEP_LEXER_FUEL = 50_000


def grammar_text(spec: GrammarSpec) -> str:
    """The spec as an llguidance grammar (not yet checked). ValueError: a schema that is not
    a JSON object."""
    from llguidance import LLMatcher

    if spec.kind == "json_schema":
        check_json_depth(spec.source, "the JSON schema")
        try:
            schema = json.loads(spec.source)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the JSON schema is not valid JSON: {exc}") from exc
        if not isinstance(schema, dict):
            raise ValueError("the JSON schema must be a JSON object")
        for pattern in schema_patterns(schema):
            check_regex(pattern)
        return str(LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS))  # type: ignore[arg-type]
    if spec.kind == "regex":
        check_regex(spec.source)
        return str(LLMatcher.grammar_from_regex(spec.source))
    for schema in lark_schemas(spec.source):  # a tool's parameters, under "auto"
        for pattern in schema_patterns(schema):
            check_regex(pattern)
    return str(LLMatcher.grammar_from_lark(spec.source))


class Grammars:
    """Compiled grammars of one tokenizer, shared by the threads that prepare requests and the
    engine's thread.

    A compile runs in the thread that asks for it, outside any lock the engine takes: `_lock`
    guards only the cache of futures (one per spec, so a spec asked for twice at once compiles
    once), and `_building` lets one build run at a time. The compiled grammar goes back inside
    the spec (`GrammarSpec.compiled`) and travels with the request, so `processor`, on the
    engine's thread, only copies it: no compile there, and no wait for one elsewhere."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self._hf = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self._ll: Any = None  # llguidance's tokenizer, built on first use (~1 s)
        self._ll_lock = threading.Lock()
        self._compiled: OrderedDict[GrammarSpec, Future[Any]] = OrderedDict()
        self._lock = threading.Lock()
        # One build at a time, a lock the engine's thread never takes: llguidance holds the
        # GIL through a matcher's build (~8 ms for an 80-property schema), and several builds
        # at once kept the step thread from the GIL for whole chains of them (a plain stream's
        # step took 320 ms instead of 11 beside 24 schemas on 6 threads; 190 ms one at a time,
        # benchmarks/bench_grammar_stall.py).
        self._building = threading.Lock()
        # Called before each build, under `_building`: what the builds take turns with (the
        # engine's steps: `AsyncEngine._pace`); None: nothing.
        self.pace: Callable[[], None] | None = None

    def compile(self, spec: GrammarSpec) -> GrammarSpec:
        """`spec` with its compiled grammar (cached per spec). ValueError naming the problem if
        it is invalid or exceeds the parser's limits (not cached: a later request tries again)."""
        if spec.compiled is not None:
            return spec
        with self._lock:
            future = self._compiled.get(spec)
            mine = future is None
            if future is None:
                future = self._compiled[spec] = Future()
                if len(self._compiled) > CACHE_SIZE:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(spec)
        if mine:
            try:
                with self._building:
                    if self.pace is not None:
                        self.pace()
                    built = self._build(spec)
                future.set_result(built)
            except BaseException as exc:
                future.set_exception(exc)
                with self._lock:
                    if self._compiled.get(spec) is future:
                        del self._compiled[spec]
        return replace(spec, compiled=future.result())

    def processor(self, spec: GrammarSpec, prompt_len: int) -> GrammarProcessor:
        """A fresh constraint for one sequence whose output starts after `prompt_len` tokens. A
        compiled spec (what `compile` returns, as the engine gets it) is only copied."""
        matcher = self.compile(spec).compiled.deep_copy()
        return GrammarProcessor(
            matcher, prompt_len, self.eos_ids, self._tokenizer(), self.vocab_size
        )

    def _build(self, spec: GrammarSpec) -> Any:
        from llguidance import LLMatcher, LLParserLimits

        text = grammar_text(spec)
        limits = LLParserLimits(
            initial_lexer_fuel=INITIAL_LEXER_FUEL,
            step_lexer_fuel=STEP_LEXER_FUEL,
            verbose_errors=False,
        )
        matcher = LLMatcher(self._tokenizer(), text, log_level=0, limits=limits)
        if not matcher.is_error():
            # The first mask builds the lexer's states: here, off the engine's thread, and a
            # grammar that exhausts the limits doing it is refused now. The second costs what
            # each mask will.
            matcher.compute_logit_bias()
            started = time.thread_time()
            matcher.compute_logit_bias()
            if time.thread_time() - started > SLOW_MASK_S:
                raise ValueError(
                    f"the {spec.kind.replace('_', ' ')}'s masks take over "
                    f"{1000 * SLOW_MASK_S:.0f} ms each: too costly to follow"
                )
        if matcher.is_error():
            raise ValueError(f"invalid {spec.kind.replace('_', ' ')}: {matcher.get_error()}")
        return matcher

    def _tokenizer(self) -> Any:
        if self._ll is None:
            with self._ll_lock:
                if self._ll is None:
                    import llguidance.hf

                    self._ll = llguidance.hf.from_tokenizer(
                        self._hf, n_vocab=self.vocab_size, eos_token=self.eos_ids
                    )
        return self._ll


class GrammarProcessor:
    """One sequence's constraint; see the module docstring. Called by the engine's thread only."""

    def __init__(
        self, matcher: Any, prompt_len: int, eos_ids: list[int], tokenizer: Any, vocab_size: int
    ) -> None:
        self.matcher = matcher
        self.prompt_len = prompt_len
        self.eos_ids = eos_ids
        self.tokenizer = tokenizer  # llguidance's, for the forced text
        self.consumed: list[int] = []  # output tokens the matcher has taken, in order
        # The sequence's committed output (learnt from the first `History`): it only grows, so
        # consumed[:stable] == committed[:stable] stays true once checked, and each call
        # compares only what came after (O(new tokens + drafts), not O(output)).
        self.committed: list[int] | None = None
        self.stable = 0
        self.bits = torch.empty((vocab_size + 31) // 32, dtype=torch.int32)
        self.slow = 0  # masks in a row that took over SLOW_MASK_S

    def forced(self, output: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens of the text the grammar forces after `output` (the committed
        tokens): the forced bytes' own tokenization, cut where the grammar would refuse it. A
        forced string is not a forced tokenization (the model may split it otherwise), so these
        are a draft for verification to decide, not tokens to commit."""
        if limit <= 0:
            return []
        if not (self._follow([]) if output is self.committed else self.advance(output)):
            return []
        text = self.matcher.compute_ff_bytes()
        if not text:
            return []
        tokens = list(self.tokenizer.tokenize_bytes(text))[:limit]
        return tokens[: self.matcher.validate_tokens(tokens)]

    def __call__(self, history: abc.Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        if isinstance(history, History) and len(history.seq.prompt_ids) == self.prompt_len:
            self.committed = history.seq.output_ids
            done = self._follow(history.drafts)
        else:
            done = self.advance(list(history[self.prompt_len :]))
        if not done:
            return logits  # after a forbidden draft token: a row verification never uses
        started = time.thread_time()
        bits = self.bits  # a bit per token, llguidance's layout: 1 allowed
        self.matcher.unsafe_compute_mask_ptr(bits.data_ptr(), 4 * bits.numel())
        self.slow = self.slow + 1 if time.thread_time() - started > SLOW_MASK_S else 0
        if self.matcher.is_error():  # the grammar ran out of its limits: fail this request
            raise RuntimeError(f"grammar: {self.matcher.get_error()}")
        if self.slow >= SLOW_MASKS:
            raise RuntimeError(
                f"grammar: {SLOW_MASKS} masks in a row took over {1000 * SLOW_MASK_S:.0f} ms "
                "each: the grammar is too costly to follow"
            )
        if not mask_logits(logits, bits):  # nothing can follow (should not happen): end
            bits.zero_()
            for e in self.eos_ids:
                bit = 1 << (e % 32)
                bits[e // 32] |= bit if bit < 2**31 else bit - 2**32  # as an int32
            mask_logits(logits, bits)
        if logits.numel() > 32 * bits.numel():  # the model's padding past the bitmask
            logits[32 * bits.numel() :] = float("-inf")
        return logits

    def advance(self, output: list[int]) -> bool:
        """Bring the matcher to the state after `output`; False if the grammar forbids one of
        its tokens (the matcher then stands after the longest allowed prefix). Compares the
        whole of `output`: the engine's rows take `_follow` instead."""
        keep = 0
        for a, b in zip(self.consumed, output, strict=False):
            if a != b:
                break
            keep += 1
        self.stable = min(self.stable, keep)
        return self._consume(keep, output[keep:])

    def _follow(self, drafts: list[int]) -> bool:
        """`advance` to the committed output and then `drafts`, comparing only past `stable`."""
        committed = self.committed
        assert committed is not None
        n, keep = len(committed), self.stable
        while keep < len(self.consumed) and keep < n + len(drafts):
            want = committed[keep] if keep < n else drafts[keep - n]
            if self.consumed[keep] != want:
                break
            keep += 1
        rest = committed[keep:] + drafts[max(0, keep - n) :]
        done = self._consume(keep, rest)
        self.stable = min(len(self.consumed), n)
        return done

    def _consume(self, keep: int, rest: list[int]) -> bool:
        """Roll the matcher back to its first `keep` tokens, then consume `rest`."""
        if keep < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - keep)
            del self.consumed[keep:]
        if not rest:
            return True
        taken = self.matcher.try_consume_tokens(rest)
        self.consumed += rest[:taken]
        return bool(taken == len(rest))
