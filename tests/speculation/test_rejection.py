from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from specserve.speculation.rejection import RejectionResult, rejection_sample, sample_from_probs

torch.set_num_threads(1)

FinalSample = Callable[[torch.Tensor], int]
Rule = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, FinalSample], RejectionResult
]

VOCAB, K, TRIALS = 6, 3, 20_000


class Recorder:
    """A final_sample that remembers the distribution it was given and returns a fixed token."""

    def __init__(self, token: int = 99) -> None:
        self.token = token
        self.dists: list[torch.Tensor] = []

    def __call__(self, dist: torch.Tensor) -> int:
        self.dists.append(dist.clone())
        return self.token


# ---------------------------------------------------------------- deterministic cases


def test_all_accepted_emits_bonus_from_last_target_row() -> None:
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])  # [k+1=3, V=3]
    q = p[:2].clone()  # p == q: every ratio is 1 and u < 1 always accepts
    rec = Recorder()
    res = rejection_sample(torch.tensor([1, 2]), q, p, torch.tensor([0.999, 0.999]), rec)
    assert res == RejectionResult(num_accepted=2, tokens=[1, 2, 99])
    assert len(rec.dists) == 1 and torch.equal(rec.dists[0], p[2])


def test_accept_test_is_strict_u_below_ratio() -> None:
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    q = torch.tensor([[0.5, 0.5]])  # p(0)/q(0) = 0.5
    draft = torch.tensor([0])
    assert rejection_sample(draft, q, p, torch.tensor([0.49]), Recorder()).num_accepted == 1
    assert rejection_sample(draft, q, p, torch.tensor([0.5]), Recorder()).num_accepted == 0


def test_first_rejection_emits_recovered_from_normalised_residual() -> None:
    p = torch.tensor([[0.2, 0.8, 0.0], [0.5, 0.0, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.2, 0.8, 0.0], [0.1, 0.6, 0.3], [0.0, 1.0, 0.0]])
    rec = Recorder(token=0)
    # d_0 = 1 accepted (p == q there); d_1 = 1 has p_1(1) = 0 -> rejected whatever u is
    res = rejection_sample(torch.tensor([1, 1, 1]), q, p, torch.tensor([0.0, 0.0, 0.0]), rec)
    assert res == RejectionResult(num_accepted=1, tokens=[1, 0])
    # max(0, p_1 - q_1) = [0.4, 0, 0.2] -> [2/3, 0, 1/3]
    torch.testing.assert_close(rec.dists[0], torch.tensor([2 / 3, 0.0, 1 / 3]))


def test_zero_residual_falls_back_to_target() -> None:
    # p <= q everywhere (q deliberately unnormalised, standing in for rounding): rejection is
    # possible but max(0, p - q) has no mass
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[0.6, 0.5]])
    rec = Recorder()
    res = rejection_sample(torch.tensor([0]), q, p, torch.tensor([0.9]), rec)
    assert res.num_accepted == 0
    assert torch.equal(rec.dists[0], p[0])


def test_no_drafts_emits_one_bonus_token() -> None:
    p = torch.tensor([[0.0, 1.0]])
    rec = Recorder(token=1)
    res = rejection_sample(
        torch.empty(0, dtype=torch.int64), torch.empty(0, 2), p, torch.empty(0), rec
    )
    assert res == RejectionResult(num_accepted=0, tokens=[1])
    assert torch.equal(rec.dists[0], p[0])


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError):
        rejection_sample(
            torch.tensor([0, 1]),
            torch.full((2, 2), 0.5),
            torch.full((2, 2), 0.5),
            torch.zeros(2),
            Recorder(),
        )


def test_sample_from_probs_is_seeded_and_respects_support() -> None:
    probs = torch.tensor([0.0, 0.3, 0.0, 0.7])
    draws = [sample_from_probs(probs, torch.Generator().manual_seed(s)) for s in range(50)]
    assert set(draws) <= {1, 3} and len(set(draws)) == 2
    again = [sample_from_probs(probs, torch.Generator().manual_seed(s)) for s in range(50)]
    assert draws == again


# ---------------------------------------------------------------- statistical checks


def tv_bound(n: int, vocab: int, delta: float = 1e-3) -> float:
    """A TV(empirical, true) level that n iid draws exceed with probability <= delta.

    E|p̂_x - p_x| <= sqrt(p_x (1 - p_x) / n) (Jensen), and sum_x sqrt(p_x) <= sqrt(V)
    (Cauchy–Schwarz), so E[TV] <= ½ sqrt(V / n). Changing one draw moves TV by at most 1/n, so
    McDiarmid gives P(TV > E[TV] + t) <= exp(-2 n t²), i.e. t = sqrt(ln(1/delta) / (2n)).
    For n = 20,000, V = 6: 0.0087 + 0.0131 = 0.022. A correct sampler fails with prob <= 0.1%
    over seeds; the seeds here are fixed, so the tests are deterministic.
    """
    return 0.5 * math.sqrt(vocab / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def fixed_dists() -> tuple[torch.Tensor, torch.Tensor]:  # p [K+1, V], q [K, V]
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(1.5 * torch.randn(K + 1, VOCAB, generator=g, dtype=torch.float64), dim=-1)
    q = torch.softmax(1.5 * torch.randn(K, VOCAB, generator=g, dtype=torch.float64), dim=-1)
    return p, q


@dataclass(frozen=True)
class Emitted:
    counts: torch.Tensor  # [K+1, V] counts[j, x]: trials whose j-th emitted token was x
    mean_accepted: float

    def num(self, j: int) -> int:  # trials that emitted a j-th token (j drafts accepted)
        return int(self.counts[j].sum())

    def dist(self, j: int) -> torch.Tensor:  # [V] empirical distribution of the j-th token
        return self.counts[j] / max(self.num(j), 1)


def run_trials(rule: Rule, p: torch.Tensor, q: torch.Tensor, n: int, seed: int) -> Emitted:
    g = torch.Generator().manual_seed(seed)
    # q_i does not depend on earlier drafts here, so drawing each column at once is the same as
    # drawing d_0, d_1, ... one after another.
    drafts = torch.stack(
        [torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(K)], dim=1
    )  # [n, K]
    uniforms = torch.rand(n, K, generator=g, dtype=q.dtype)  # [n, K]

    def final_sample(dist: torch.Tensor) -> int:
        return sample_from_probs(dist, g)

    counts = [[0] * VOCAB for _ in range(K + 1)]
    accepted = 0
    for d, u in zip(drafts.unbind(0), uniforms.unbind(0), strict=True):
        res = rule(d, q, p, u, final_sample)
        assert len(res.tokens) == res.num_accepted + 1
        for j, token in enumerate(res.tokens):
            counts[j][token] += 1
        accepted += res.num_accepted
    return Emitted(torch.tensor(counts, dtype=torch.float64), mean_accepted=accepted / n)


def expected_mean_accepted(p: torch.Tensor, q: torch.Tensor) -> float:
    # P(accept d_i | reached i) = beta_i = sum_x min(p_i, q_i), independently per position here,
    # so E[accepted] = sum_j P(accepted >= j+1) = sum_j prod_{i<=j} beta_i
    beta = torch.minimum(p[:K], q).sum(dim=-1)
    return float(torch.cumprod(beta, dim=0).sum())


def always_accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    final_sample: FinalSample,
) -> RejectionResult:
    """Broken on purpose: every draft with q(d) > 0 is accepted, so tokens follow q, not p."""
    k = draft_tokens.shape[0]
    assert bool((draft_probs[torch.arange(k), draft_tokens] > 0).all())
    return RejectionResult(k, [*draft_tokens.tolist(), final_sample(target_probs[k])])


def recover_from_target(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    final_sample: FinalSample,
) -> RejectionResult:
    """Broken on purpose, subtly: the right accept test, but it resamples from p_i on rejection
    instead of the residual norm(max(0, p_i - q_i)), over-weighting tokens the draft likes."""
    for i, d in enumerate(draft_tokens.tolist()):
        if float(uniforms[i]) * float(draft_probs[i, d]) >= float(target_probs[i, d]):
            return RejectionResult(i, [*draft_tokens[:i].tolist(), final_sample(target_probs[i])])
    k = draft_tokens.shape[0]
    return RejectionResult(k, [*draft_tokens.tolist(), final_sample(target_probs[k])])


@pytest.fixture(scope="module")
def dists() -> tuple[torch.Tensor, torch.Tensor]:
    return fixed_dists()


@pytest.fixture(scope="module")
def correct(dists: tuple[torch.Tensor, torch.Tensor]) -> Emitted:
    p, q = dists
    return run_trials(rejection_sample, p, q, TRIALS, seed=0)


def test_first_emitted_token_follows_target(
    dists: tuple[torch.Tensor, torch.Tensor], correct: Emitted
) -> None:
    p, q = dists
    assert tv(q[0], p[0]) > 0.2  # the draft really differs, so matching p is not free
    assert tv(correct.dist(0), p[0]) < tv_bound(TRIALS, VOCAB)


@pytest.mark.parametrize("j", range(1, K + 1))
def test_later_emitted_tokens_follow_target(
    j: int, dists: tuple[torch.Tensor, torch.Tensor], correct: Emitted
) -> None:
    # Given d_0..d_{j-1} accepted, the j-th token is d_j if accepted, else recovered from the
    # residual of (p_j, q_j), or the bonus from p_K when j == K; either way it must follow p_j
    # (p_j does not depend on the earlier drafts in this test).
    p, _ = dists
    assert correct.num(j) > 500  # ~3% of trials reach the bonus (j = K) with these p, q
    assert tv(correct.dist(j), p[j]) < tv_bound(correct.num(j), VOCAB)


def test_mean_accepted_matches_theory(
    dists: tuple[torch.Tensor, torch.Tensor], correct: Emitted
) -> None:
    p, q = dists
    # accepted is in [0, K], so its sample mean has sd <= K / (2 sqrt(n)) ~ 0.011; allow 4 sd
    assert abs(correct.mean_accepted - expected_mean_accepted(p, q)) < 4 * K / (2 * TRIALS**0.5)


def broken_first_token_dist(rule: Rule, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact distribution of the first emitted token under each broken rule."""
    if rule is always_accept:
        return q[0]
    beta = torch.minimum(p[0], q[0]).sum()
    return torch.minimum(p[0], q[0]) + (1 - beta) * p[0]


@pytest.mark.parametrize("rule", [always_accept, recover_from_target])
def test_statistic_detects_broken_rules(
    rule: Rule, dists: tuple[torch.Tensor, torch.Tensor]
) -> None:
    p, q = dists
    bound = tv_bound(TRIALS, VOCAB)
    # the broken output is far from p in exact arithmetic...
    assert tv(broken_first_token_dist(rule, p, q), p[0]) > 3 * bound
    # ...and the same statistic at the same sample size sees it
    broken = run_trials(rule, p, q, TRIALS, seed=0)
    assert tv(broken.dist(0), p[0]) > 2 * bound
