"""Rejection sampling for probabilistic drafts (Leviathan et al. 2023; Chen et al. 2023).

Terms, for one sequence and one step with k drafts d_0..d_{k-1}:

- *accepted*: draft d_i passes its test u_i < min(1, p_i(d_i) / q_i(d_i)) and every draft before
  it passed too. Accepted drafts are emitted as they are.
- *recovered*: at the first rejected position i the step emits one token drawn from the residual
  norm(max(0, p_i - q_i)) instead of d_i; the remaining drafts are discarded.
- *bonus*: when all k drafts are accepted, the target's distribution at the next position, p_k, is
  already computed, so one extra token is drawn from it for free.

Either way a step emits num_accepted + 1 tokens, and each emitted token is distributed exactly as
the target would have sampled it without speculation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RejectionResult:
    num_accepted: int  # drafts accepted, 0..k
    tokens: list[int]  # accepted drafts + one recovered or bonus token; len = num_accepted + 1


def rejection_sample(
    draft_tokens: torch.Tensor,  # [k] int64, d_i ~ q_i
    draft_probs: torch.Tensor,  # [k, vocab] q, the distributions the drafts were sampled from
    target_probs: torch.Tensor,  # [k + 1, vocab] p, target distributions at the k+1 positions
    uniforms: torch.Tensor,  # [k] in [0, 1), one per accept test
    final_sample: Callable[[torch.Tensor], int],  # draws one token from a [vocab] distribution
) -> RejectionResult:
    """Accept a prefix of the drafts and emit one recovered or bonus token (see module docstring).

    Why it is exact, per position, writing p, q for p_i, q_i and d for the draft:
        P(emit x) = P(d = x, accepted) + P(rejected) * residual(x)
                  = q(x) * min(1, p(x)/q(x)) + (1 - sum_y min(p(y), q(y))) * residual(x)
                  = min(p(x), q(x))          + sum_y max(0, p(y) - q(y)) * residual(x)
                  = min(p(x), q(x))          + max(0, p(x) - q(x))
                  = p(x),
    using sum_y min(p, q) + sum_y max(0, p - q) = sum_y p = 1 and
    residual = max(0, p - q) / sum_y max(0, p - q).
    """
    k = draft_tokens.shape[0]
    if draft_probs.shape[0] != k or target_probs.shape[0] != k + 1 or uniforms.shape[0] != k:
        raise ValueError(
            f"shape mismatch: draft_tokens {tuple(draft_tokens.shape)}, draft_probs "
            f"{tuple(draft_probs.shape)}, target_probs {tuple(target_probs.shape)}, "
            f"uniforms {tuple(uniforms.shape)}"
        )
    rows = torch.arange(k)
    p_d = target_probs[rows, draft_tokens]  # [k] p_i(d_i)
    q_d = draft_probs[rows, draft_tokens]  # [k] q_i(d_i)
    # u < min(1, p/q)  <=>  u * q < p  for q > 0 (u < 1); no division, and a draft with
    # q(d) == 0 (impossible if d ~ q) is accepted iff p(d) > 0, matching p/q = inf.
    rejected = uniforms * q_d >= p_d  # [k]
    num_accepted = int(rejected.to(torch.int8).argmax()) if bool(rejected.any()) else k
    accepted = draft_tokens[:num_accepted].tolist()

    if num_accepted == k:
        final_dist = target_probs[k]  # bonus
    else:
        final_dist = _residual(target_probs[num_accepted], draft_probs[num_accepted])  # recovered
    return RejectionResult(num_accepted=num_accepted, tokens=[*accepted, final_sample(final_dist)])


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # [vocab] -> [vocab]
    """norm(max(0, p - q)); falls back to p when the residual mass is 0.

    The mass is sum_y max(0, p - q) = 1 - sum_y min(p, q), which is 0 only when p == q, and then
    rejection has probability 0 in exact arithmetic. Rounding can still reject there, and any
    draw from p keeps the output on the target's distribution.
    """
    residual = (p - q).clamp_min(0.0)
    mass = residual.sum()
    return residual / mass if bool(mass > 0) else p


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from ``probs`` [vocab] (non-negative, positive sum) with ``generator``."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
