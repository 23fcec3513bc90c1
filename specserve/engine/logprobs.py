"""Log-probabilities a request asked for, from the logits rows of the pass that produced them.

An emitted token's log-probability is the target's own at that position, under the distribution
the sampler draws from there (`processed_logits`: penalties, temperature, top-k, top-p; removed
tokens are -inf), from the same pass that verified it. A prompt token's is the model's raw
log-softmax at the position before it.

Every value is at least LOGPROB_FLOOR: a token top-k/top-p removed has -inf, which JSON cannot
carry; as vLLM, it is reported as -9999.0 (the list keeps the length the request asked for).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specserve.engine.plan import SeqPlan
from specserve.outputs import TokenLogprob
from specserve.runner.sampler import SampleRow, processed_logits


def emitted_logprobs(
    logits: torch.Tensor,  # [n, vocab]: the rows that produced `tokens`, in order
    rows: list[SampleRow],  # [n]
    tokens: list[int],  # [n]
    top: int,
) -> list[TokenLogprob]:
    out = []
    for i, token in enumerate(tokens):
        lp = processed_logits(logits[i], rows[i]).log_softmax(-1)
        out.append(entry(lp, token, top))
    return out


def span_logprobs(
    p: SeqPlan, tokens: list[int], logits: torch.Tensor, rows: list[SampleRow]
) -> list[TokenLogprob] | None:
    """The emitted tokens' log-probabilities, if `p`'s request asked for them: token i from
    its logits row i (the pass's logits [rows, vocab], rows of the whole pass)."""
    top = p.seq.params.logprobs
    if top is None:
        return None
    own = slice(p.logits.start, p.logits.start + len(tokens))
    return emitted_logprobs(logits[own], rows[own], tokens, top)


# Hidden states [rows, hidden] -> logits [rows, vocab] (the model's head).
LogitsOf = Callable[[torch.Tensor], torch.Tensor]
# Prompt rows turned into logits at once: a prefill chunk of 2048 rows would otherwise hold
# [2048, vocab] logits plus their log-softmax (2 x 384 MiB on a 49k vocabulary).
PROMPT_LOGPROB_ROWS = 64


@torch.inference_mode()
def prompt_logprobs(
    hidden: torch.Tensor,  # [n, hidden]: final states of prompt positions p .. p + n - 1
    next_tokens: list[int],  # [n]: prompt tokens at positions p + 1 .. p + n
    logits_of: LogitsOf,
    rows: int = PROMPT_LOGPROB_ROWS,
) -> list[TokenLogprob]:
    out: list[TokenLogprob] = []
    for a in range(0, len(next_tokens), rows):
        lp = logits_of(hidden[a : a + rows]).float().log_softmax(-1)  # [<= rows, vocab]
        out += [entry(lp[i], t, 0) for i, t in enumerate(next_tokens[a : a + rows])]
    return out


LOGPROB_FLOOR = -9999.0


def entry(lp: torch.Tensor, token: int, top: int) -> TokenLogprob:  # lp: [vocab]
    best: tuple[tuple[int, float], ...] = ()
    if top:
        values, ids = lp.topk(min(top, lp.numel()))
        values = values.clamp(min=LOGPROB_FLOOR)
        best = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token, max(float(lp[token]), LOGPROB_FLOOR), best)
