"""When the EAGLE head is asked to draft in a sequence: what a drafted token costs, and the
running mean, per sequence, of what asking it has gained (`EagleProposer` gates itself on it;
`HybridProposer` keeps its own over the drafts the head served)."""

from __future__ import annotations

from specserve.speculation.calibration import PerSequenceMean

# The head's cost per drafted token, in target tokens (one sequence's share of a decode step),
# as benchmarks/bench_eagle.py measures it on the Zen 4 with the target's step before each
# drafting step (as in the engine): 0.11 at batch 1 and 0.07 at 16 with the layer in one native
# call a token, 0.054-0.060 at batch 1 and 0.050-0.058 at 16 with a greedy drafting step in one
# call (the 2026-12-04 14:53 and 16:20 sections of `git show 9ebb6f8:docs/benchmarks.md`, raw
# files under docs/bench/ at that commit): rounded up. A sequence is
# drafted for while the head's drafts there have been gaining tokens (and now and then after,
# HEAD_RECHECK): a running mean, per draft, of the tokens verification accepted less drafted x
# this (a draft the policy does not verify, as under load, gains nothing).
HEAD_TOKEN_COST = 0.08
HEAD_PRIOR = 1.0  # tokens gained per head draft assumed before any outcome
HEAD_RATE = 0.2  # weight of each new outcome in a sequence's running mean
# A new sequence starts from a running mean over every sequence's outcomes (each weighing
# this), floored at HEAD_EXPLORE: once the head stops paying on the server's traffic, a new
# sequence tries it about twice (alone), or (in the hybrid) only where the lookup expects less
# than this, instead of about six times from HEAD_PRIOR, each first try catching the head up
# over the whole prompt.
HEAD_SHARED_RATE = 0.05
HEAD_EXPLORE = 0.1

# A sequence whose mean is not above zero is asked again after this many steps it sat out
# (doubling while asking again does not pay, up to HEAD_RECHECK_MAX): the text may have turned
# predictable. Sitting out costs nothing but keeping the window's last pairs (`sync`); asking
# again runs them in the drafting call itself.
HEAD_RECHECK = 32
HEAD_RECHECK_MAX = 256


def head_mean() -> PerSequenceMean:
    """Per sequence, what asking the head gained (see HEAD_PRIOR .. HEAD_EXPLORE)."""
    return PerSequenceMean(HEAD_PRIOR, HEAD_RATE, HEAD_EXPLORE, HEAD_SHARED_RATE)
