"""Verification of drafts against the target's scores from one forward pass.

For a sequence with drafts d_1..d_k the runner scored positions [last, d_1..d_k] and the sampler
turned them into the target's own picks t_1..t_{k+1}, where t_i is what the target emits at that
output position given d_1..d_{i-1} were emitted before it (argmax when greedy; the counter-based
seeded sample otherwise, a deterministic function of (seed, position, p_i)).

Deterministic drafts: accept d_i while d_i == t_i. The first mismatch emits t_i instead (the
correction); if all k match, t_{k+1} is the bonus. Every emitted token is then exactly the token
the target emits without speculation, so greedy and seeded outputs are bit-identical.

Sampled drafts (a draft model sampling from q): rejection sampling, see `speculation/rejection.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.speculation.rejection import rejection_sample, sample_from_probs


@dataclass(frozen=True)
class VerifyResult:
    num_accepted: int  # drafts accepted (0..k)
    tokens: list[int]  # emitted: accepted drafts then one correction or bonus; len = accepted + 1


def verify_deterministic(drafts: list[int], targets: list[int]) -> VerifyResult:
    """drafts [k], targets [k+1] -> the longest matching prefix plus the target's next token."""
    if len(targets) != len(drafts) + 1:
        raise ValueError(f"need k+1 targets for k drafts, got {len(targets)} for {len(drafts)}")
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return VerifyResult(accepted, [*drafts[:accepted], targets[accepted]])


def verify_sampled(
    drafts: list[int],
    draft_probs: torch.Tensor,  # [k, vocab] q: the distributions the drafts were sampled from
    target_logits: torch.Tensor,  # [k+1, vocab] processed target logits (temperature applied)
    seed: int,
    out_pos: int,  # output position of the first scored token
) -> VerifyResult:
    """Rejection sampling for sampled drafts; the emitted tokens are distributed exactly as the
    target's own samples. Randomness is keyed by (seed, out_pos), never by batch or step."""
    generator = torch.Generator().manual_seed(_mix(seed, out_pos))
    k = len(drafts)
    p = target_logits.float().softmax(-1).cpu()  # [k+1, vocab]
    result = rejection_sample(
        torch.tensor(drafts, dtype=torch.long),
        draft_probs.float().cpu(),
        p,
        torch.rand(k, generator=generator, dtype=torch.float64).float(),
        lambda dist: sample_from_probs(dist, generator),
    )
    return VerifyResult(result.num_accepted, result.tokens)


def _mix(seed: int, position: int) -> int:
    return (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) & 0x7FFFFFFFFFFFFFFF
