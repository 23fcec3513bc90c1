"""Logit processing and counter-based sampling.

A request's token at output position t is a deterministic function of (seed, t, p_t): Gumbel-max
with noise from a counter-based hash of (seed, t, token id). It never depends on the batch, the
step boundaries or how many positions were scored together, which is what lets speculative
verification reproduce seeded outputs exactly: accept a draft iff it equals this sample.
"""

from __future__ import annotations

import math
from collections import abc
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from specserve.request import History, LogitsProcessor, SamplingParams

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class SampleRow:
    """One logits row to turn into a token."""

    params: SamplingParams
    # Tokens before this position (prompt + output + earlier drafts): the engine's `History`
    # view, or a list; read only by the penalties and the processors, so callers may leave it
    # empty when `params.reads_history` is false and there are none.
    history: abc.Sequence[int]
    out_pos: int  # output position t being sampled (0 = first generated token)
    processors: tuple[LogitsProcessor, ...] = ()  # the request's, applied first


@dataclass(frozen=True)
class Sampled:
    token: int
    logprob: float  # log p_t(token) under the processed distribution


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    # (h * c) mod 2^32 for h < 2^32 in int64 without overflow: split c into 16-bit halves.
    lo = h * (c & 0xFFFF)
    hi = ((h * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def counter_uniform(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    """[vocab] float64 in (0, 1), a pure function of (seed, position, token id)."""
    key = _splitmix64((seed & _M64) ^ _splitmix64(position))
    ids = torch.arange(vocab_size, dtype=torch.int64)
    h = _fmix32(_mul32(ids, 0x9E3779B1) ^ (key & _M32))
    h = _fmix32(h ^ (key >> 32))
    return (h.double() + 0.5) / 2.0**32


def apply_repetition_penalty(
    logits: torch.Tensor, history: abc.Sequence[int], penalty: float
) -> None:
    """In place on [V]: divide positive logits of seen tokens by penalty, multiply negative ones.
    The seen tokens of a `History` are kept as its sequence grows (no pass over the context)."""
    if penalty == 1.0 or not history:
        return
    if isinstance(history, History):
        idx = torch.from_numpy(history.seen_ids()).to(logits.device)
    else:
        idx = torch.tensor(sorted(set(history)), dtype=torch.long, device=logits.device)
    seen = logits[idx]
    logits[idx] = torch.where(seen > 0, seen / penalty, seen * penalty)


def apply_logit_bias(logits: torch.Tensor, bias: tuple[tuple[int, float], ...]) -> None:
    """In place on [V]: add each (token, value) of `bias` to that token's logit."""
    if not bias:
        return
    ids, values = _bias_tensors(bias, logits.device)
    logits[ids] += values


@lru_cache(maxsize=256)
def _bias_tensors(
    bias: tuple[tuple[int, float], ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's bias as (ids, float32 values), built once, not for every row it scores."""
    ids = torch.tensor([t for t, _ in bias], dtype=torch.long, device=device)
    return ids, torch.tensor([v for _, v in bias], dtype=torch.float32, device=device)


def output_counts(history: abc.Sequence[int], out_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct generated tokens before a row and their counts ([m] int64 each): the last
    `out_pos` tokens of its history (a `History` keeps them as its sequence grows)."""
    if isinstance(history, History):
        return history.output_counts()
    tail = list(history[max(0, len(history) - out_pos) :]) if out_pos else []
    ids, counts = np.unique(np.array(tail, dtype=np.int64), return_counts=True)
    return ids, counts.astype(np.int64)


def apply_output_penalties(logits: torch.Tensor, row: SampleRow) -> None:
    """In place on [V], OpenAI's presence and frequency penalties over the generated tokens:
    logit[j] -= frequency * count[j] + presence * (count[j] > 0)."""
    p = row.params
    if p.presence_penalty == 0.0 and p.frequency_penalty == 0.0:
        return
    ids, counts = output_counts(row.history, row.out_pos)
    if not len(ids):
        return
    idx = torch.from_numpy(ids).to(logits.device)
    penalty = torch.from_numpy(counts).to(logits.device, logits.dtype) * p.frequency_penalty
    logits[idx] -= penalty + p.presence_penalty


def apply_min_p(logits: torch.Tensor, min_p: float) -> None:
    """In place on [V] (after temperature): -inf where p < min_p * max p, i.e. where
    logit < max logit + log(min_p)."""
    if min_p <= 0.0:
        return
    logits[logits < logits.max() + math.log(min_p)] = float("-inf")


# Temperatures in (0, MIN_TEMPERATURE) act as MIN_TEMPERATURE (vLLM's floor): float32 logits
# divided by a tinier one overflow to inf, and inf - inf is NaN. The pick is the same argmax.
MIN_TEMPERATURE = 1e-2


def processed_logits(logits: torch.Tensor, row: SampleRow) -> torch.Tensor:
    """[V] -> [V] float32: the request's processors, logit bias, penalties, then (sampling)
    temperature, min-p, top-k and top-p (removed tokens are -inf). vLLM's order."""
    p = row.params
    out = logits.float().clone()
    for processor in row.processors:
        out = processor(row.history, out)
    apply_logit_bias(out, p.logit_bias)
    apply_repetition_penalty(out, row.history, p.repetition_penalty)
    apply_output_penalties(out, row)
    if p.greedy:
        return out
    out /= max(p.temperature, MIN_TEMPERATURE)
    apply_min_p(out, p.min_p)
    if 0 < p.top_k < out.numel():
        kth = torch.topk(out, p.top_k).values[-1]
        out[out < kth] = float("-inf")
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        probs = sorted_logits.softmax(-1)
        # Keep a token iff the mass strictly before it is < top_p (the top token always stays).
        drop = (probs.cumsum(-1) - probs) >= p.top_p
        out[order[drop]] = float("-inf")
    return out


def sample_row(logits: torch.Tensor, row: SampleRow) -> Sampled:
    """logits [V] -> the row's token: argmax if greedy, else seeded Gumbel-max."""
    z = processed_logits(logits, row)
    logprobs = z.log_softmax(-1)
    if row.params.greedy:
        token = int(torch.argmax(z))
    else:
        seed = row.params.seed if row.params.seed is not None else 0
        u = counter_uniform(seed, row.out_pos, z.numel()).to(z.device)
        gumbel = -torch.log(-torch.log(u))
        token = int(torch.argmax(logprobs.double() + gumbel))
    return Sampled(token=token, logprob=float(logprobs[token]))


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [N, V] -> [N] int64, the first maximum of each row (as torch.argmax). On the CPU
    through numpy, in this thread: 6-14 us a 49k-token row here against torch's 45-90 us idle
    and ~100-200 us with the other core busy."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.numpy().argmax(axis=-1).astype(np.int64))
    return logits.argmax(-1)


def plain_greedy(row: SampleRow) -> bool:
    """The row's pick is the raw logits' argmax: no penalty, bias or processor."""
    return row.params.plain_greedy and not row.processors


def pick_tokens(logits: torch.Tensor, rows: list[SampleRow]) -> list[int]:
    """logits [N, V] -> each row's token, as `sample_row` picks it. Plain greedy rows take the
    raw argmax in one call and no softmax (nothing here needs their log-probabilities:
    `engine/logprobs.py` computes those only for requests that ask)."""
    if all(plain_greedy(r) for r in rows):
        return argmax_rows(logits).tolist()
    return [sample_row(logits[i], r).token for i, r in enumerate(rows)]
