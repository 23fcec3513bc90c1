"""Verification of drafts against the target's scores from one forward pass.

For a sequence with drafts d_1..d_k the runner scored positions [last, d_1..d_k] and the sampler
turned them into the target's own picks t_1..t_{k+1}, where t_i is what the target emits at that
output position given d_1..d_{i-1} were emitted before it (argmax when greedy; the counter-based
seeded sample otherwise, a deterministic function of (seed, position, p_i)).

Deterministic drafts: accept d_i while d_i == t_i. The first mismatch emits t_i instead (the
correction); if all k match, t_{k+1} is the bonus. Every emitted token is then exactly the token
the target emits without speculation, so greedy and seeded outputs are bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass


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
