"""Sampled drafts keep the target's distribution, checked through the engine.

2000 requests with the same prompt and seeds 0..1999 sample 4 tokens each with top_k=4, so the
first three tokens have at most 4^3 = 64 outcomes whose exact probability under the target,
p1(a) p2(b | a) p3(c | a, b), takes 21 forward passes to compute. Token 1 comes from the prefill
step; tokens 2 and 3 from a speculative step in which a noisy draft model proposed k=2 sampled
drafts (accepted, recovered from the residual, or the bonus). The empirical joint must be within
the TV bound of `test_rejection.tv_bound`; the same run with the residual replaced by p (a
subtle bug: right accept test, wrong resampling) must be outside it. The same holds under a
grammar, against the masked target.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.engine.engine import Engine
from specserve.request import GrammarSpec, SamplingParams
from specserve.runner.model_runner import RunItem
from specserve.runner.sampler import SampleRow, processed_logits
from specserve.speculation import rejection
from tests.engine.helpers import make_engine, run_all
from tests.speculation.test_rejection import tv_bound
from tests.tiny import noisy_copy

PROMPT = [5, 6, 7, 8]
REQUESTS = 2000
Joint = dict[tuple[int, ...], float]


# Under a grammar: lowercase letters only, at least 12 of them (so EOS cannot come within the
# first three tokens, which are at most a few characters each).
LETTERS = GrammarSpec("regex", "[a-z]{12,20}")


def params(seed: int, grammar: GrammarSpec | None = None) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=4,
        temperature=1.5,
        top_k=4,
        seed=seed,
        ignore_eos=grammar is None,
        grammar=grammar,
    )


@pytest.fixture(scope="module")
def draft_dir(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return noisy_copy(tiny_llama, tmp_path_factory.mktemp("noisy-draft"), noise=0.3)


def engine(tiny_llama: Path, draft_dir: Path) -> Engine:
    """Static policy: the distribution through rejection sampling is under test, so every
    draft is verified (the adaptive policy, learning that these drafts land rarely, verifies
    none of them)."""
    return make_engine(
        tiny_llama,
        num_blocks=4096,
        max_batch_tokens=4096,
        max_running=512,
        speculate=2,
        proposer="draft",
        draft_model=str(draft_dir),
        policy="static",
    )


def exact_joint(e: Engine, grammar: GrammarSpec | None = None) -> Joint:
    """P(first three tokens) under the target, processed as the engine samples them (the
    grammar's mask first, when there is one)."""

    def dist(prefix: list[int]) -> torch.Tensor:  # [vocab]
        ids = PROMPT + prefix
        table = list(range(-(-len(ids) // e.res.allocator.block_size)))  # blocks nobody holds
        logits = e.res.runner.run([RunItem(ids, 0, table, 1)]).logits[0]
        mask = () if grammar is None else (e.grammars.processor(grammar, len(PROMPT)),)
        row = SampleRow(params(0, grammar), ids if mask else [], len(prefix), mask)
        z = processed_logits(logits, row)
        return torch.softmax(z.double(), dim=-1)

    joint: Joint = {}
    p1 = dist([])
    for a in torch.nonzero(p1).flatten().tolist():
        p2 = dist([a])
        for b in torch.nonzero(p2).flatten().tolist():
            p3 = dist([a, b])
            for c in torch.nonzero(p3).flatten().tolist():
                joint[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return joint


def empirical_tv(e: Engine, exact: Joint, grammar: GrammarSpec | None = None) -> float:
    outs = run_all(e, [PROMPT] * REQUESTS, [params(s, grammar) for s in range(REQUESTS)])
    counts: dict[tuple[int, ...], int] = {}
    for tokens in outs:
        counts[tuple(tokens[:3])] = counts.get(tuple(tokens[:3]), 0) + 1
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(k, 0) / REQUESTS - exact.get(k, 0.0)) for k in keys)


def test_sampled_drafts_follow_the_target_through_the_engine(
    tiny_llama: Path, draft_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(tiny_llama, draft_dir)
    exact = exact_joint(e)
    assert len(exact) == 64 and abs(sum(exact.values()) - 1) < 1e-6
    bound = tv_bound(REQUESTS, len(exact))
    assert empirical_tv(e, exact) < bound
    stats = e.stats.proposer
    # Drafts were sampled, verified, and both accepted and rejected (residual path taken).
    assert stats.drafted_tokens >= REQUESTS and 0 < stats.accepted_tokens < stats.drafted_tokens

    def broken_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return p  # resample from p after a rejection: over-weights what the draft likes

    monkeypatch.setattr(rejection, "_residual", broken_residual)
    assert empirical_tv(engine(tiny_llama, draft_dir), exact) > bound


def test_sampled_drafts_follow_the_constrained_target(tiny_llama: Path, draft_dir: Path) -> None:
    """The draft model proposes from its own unconstrained q; the target's rows are masked, so
    a forbidden draft token has p = 0 and is always rejected, and the residual is masked too:
    the joint is the constrained target's."""
    e = engine(tiny_llama, draft_dir)
    exact = exact_joint(e, LETTERS)
    assert len(exact) == 64 and abs(sum(exact.values()) - 1) < 1e-6
    assert all(e.tokenizer.decode(list(k)).isalpha() for k in exact)  # letters only
    assert empirical_tv(e, exact, LETTERS) < tv_bound(REQUESTS, len(exact))
    stats = e.stats.proposer
    assert stats.drafted_tokens >= REQUESTS and 0 < stats.accepted_tokens < stats.drafted_tokens
