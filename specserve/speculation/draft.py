"""Draft-model proposer: a second, smaller model with its own paged KV cache proposes k tokens.

Per sequence the proposer keeps a block table and `num_computed`: the draft KV holds K/V for the
sequence's first `num_computed` tokens. One `propose` call runs the draft autoregressively:

    step 1:   feed tokens[num_computed:] (catch-up; at least the last token) -> d_1
    step j:   feed d_{j-1} at position n + j - 2                             -> d_j,  j = 2..k

so afterwards the draft KV holds n + k - 1 positions: the n tokens and d_1..d_{k-1}. After the
engine commits, `sync` keeps only positions < seq.num_computed: those hold final tokens (accepted
drafts are the ids the draft was fed); from the first rejected draft on, the rest is rolled back
and its blocks freed.

A catch-up longer than `max_step_tokens` in total (a sequence's first proposal after its prompt,
or after many steps without speculation) is fed ahead in bounded forwards, so the draft's peak
activation stays that of a `max_step_tokens` step.

Sampled drafts come with q (the rows they were drawn from) for rejection sampling; the noise is a
pure function of (request seed, output position), so a request's drafts do not depend on batching.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specserve.config import EngineConfig
from specserve.models.fingerprint import Fingerprint, target_fingerprint
from specserve.models.llama import DecoderLM
from specserve.models.loader import resolve_model_dir
from specserve.request import SamplingParams, Sequence
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.runner.sampler import SampleRow, processed_logits
from specserve.scheduler.kv_blocks import BlockAllocator
from specserve.speculation.draft_loading import load_draft_model
from specserve.speculation.proposer import Draft, Loaded, Proposer, Registration, Target


@dataclass
class _DraftState:
    """One sequence's draft KV: its first `num_computed` tokens, in `block_table`."""

    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0


@dataclass
class _Plan:
    """One sequence's share of a `propose` call."""

    state: _DraftState
    params: SamplingParams
    context: list[int]  # the sequence's tokens, then the drafts picked so far
    num_tokens: int  # n: the sequence's own tokens (context[:n])
    out_pos: int  # output position of d_1
    k: int  # drafts to pick, >= 1
    probs: list[torch.Tensor] = field(default_factory=list)  # k x [vocab] q rows when sampling
    confidence: list[float] = field(default_factory=list)  # q(d_i) of each draft picked

    @property
    def num_unfed(self) -> int:
        return len(self.context) - self.state.num_computed

    @property
    def drafts(self) -> list[int]:
        return self.context[self.num_tokens :]

    def draft(self) -> Draft:
        probs = torch.stack(self.probs) if self.probs else None  # [k, vocab]
        return Draft(tokens=self.drafts, probs=probs, confidence=list(self.confidence))


class DraftModelProposer(Proposer):
    """Proposes with a draft model; see the module docstring for the KV bookkeeping."""

    name = "draft"

    def __init__(
        self,
        model: DecoderLM,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        max_step_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.max_step_tokens = max_step_tokens
        self.runner = ModelRunner(model, num_blocks, block_size, device)
        self.allocator = BlockAllocator(num_blocks, block_size)
        self._states: dict[int, _DraftState] = {}

    @classmethod
    def load(
        cls,
        draft_path: str,
        *,
        target_vocab_size: int,
        target_tokenizer: Any,
        device: torch.device,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        max_step_tokens: int | None = None,
    ) -> DraftModelProposer:
        """Load the draft at `draft_path` (HF dir or GGUF); ValueError if it cannot pair with the
        target (vocabulary size, tokenizer vocabulary, eos/bos)."""
        model = load_draft_model(draft_path, target_vocab_size, target_tokenizer, device, dtype)
        return cls(model, num_blocks, block_size, device, max_step_tokens)

    # ------------------------------------------------------------ memory accounting
    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    def kv_blocks_in_use(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def kv_bytes(self) -> int:
        return self.runner.kv_bytes

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    # ------------------------------------------------------------------- protocol
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        plans = [self._plan(seq, k) for seq, k in zip(seqs, ks, strict=True)]
        active = [p for p in plans if p is not None]
        self._catch_up(active)
        while active:
            self._step(active)
            active = [p for p in active if len(p.drafts) < p.k]
        return [p.draft() if p is not None else Draft(tokens=[]) for p in plans]

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        del hidden  # the draft reads its own states, not the target's
        state = self._states.get(seq.seq_id)
        if state is not None:
            self._rewind(state, seq.num_computed)

    def release(self, seq: Sequence) -> None:
        state = self._states.pop(seq.seq_id, None)
        if state is not None:
            self.allocator.free(state.block_table)

    # ---------------------------------------------------------------- internals
    def _plan(self, seq: Sequence, k: int) -> _Plan | None:
        """Reserve draft KV for up to k drafts; None when not even one fits (never raises)."""
        n = seq.num_tokens
        state = self._states.setdefault(seq.seq_id, _DraftState())
        # Feed at least the last token: the first step needs logits at position n - 1. After
        # `sync` this is a no-op. Without it, it would still be enough, as commits only append:
        # the first rejected draft's position becomes the correction's, n - 1.
        self._rewind(state, min(state.num_computed, n - 1))
        # k drafts feed positions up to n + k - 2, which must exist in the draft's RoPE table
        # and fit in the blocks this sequence holds plus the free ones.
        capacity = (len(state.block_table) + self.allocator.num_free) * self.allocator.block_size
        k = min(k, self.model.arch.max_position - n + 1, capacity - n + 1)
        if k < 1:
            return None
        self.allocator.grow(state.block_table, n + k - 1)
        return _Plan(state, seq.params, seq.token_ids, n, len(seq.output_ids), k)

    def _catch_up(self, plans: list[_Plan]) -> None:
        """While the first drafting step would feed more than `max_step_tokens`, feed backlog
        ahead in forwards of at most that many tokens."""
        limit = self.max_step_tokens
        while limit is not None and sum(p.num_unfed for p in plans) > limit:
            items = _take_backlog(plans, limit)
            if not items:
                return  # only last tokens remain: the drafting step must feed them together
            self.runner.run(items)

    def _step(self, plans: list[_Plan]) -> None:
        """One batched draft forward: feed each plan's unfed context, pick its next draft."""
        items = [
            RunItem(p.context[p.state.num_computed :], p.state.num_computed, p.state.block_table, 1)
            for p in plans
        ]
        logits = self.runner.run(items).logits  # [len(plans), vocab]
        for p, row in zip(plans, logits, strict=True):
            p.state.num_computed = len(p.context)
            _pick(p, row)

    def _rewind(self, state: _DraftState, num_tokens: int) -> None:
        state.num_computed = min(state.num_computed, num_tokens)
        self.allocator.truncate(state.block_table, state.num_computed)


def _take_backlog(plans: list[_Plan], limit: int) -> list[RunItem]:
    """Up to `limit` unfed tokens, never a plan's last (its logits start the drafting), as run
    items without logits; marks them fed."""
    items = []
    for p in plans:
        start = p.state.num_computed
        take = min(p.num_tokens - 1 - start, limit)
        if take > 0:
            items.append(RunItem(p.context[start : start + take], start, p.state.block_table, 0))
            p.state.num_computed += take
            limit -= take
    return items


def _pick(plan: _Plan, logits: torch.Tensor) -> None:  # logits: [vocab]
    """Append the next draft: argmax of the processed logits when greedy, else a sample from
    q = softmax(processed logits), whose row is kept for rejection sampling."""
    out_pos = plan.out_pos + len(plan.drafts)
    z = processed_logits(logits, SampleRow(plan.params, plan.context, out_pos))  # [vocab]
    q = torch.softmax(z.float(), dim=-1)  # [vocab]
    if plan.params.greedy:
        token = int(torch.argmax(z))
    else:
        seed = plan.params.seed if plan.params.seed is not None else 0
        token = int(torch.multinomial(q, 1, generator=_draft_generator(seed, out_pos, q.device)))
        plan.probs.append(q)
    plan.context.append(token)
    plan.confidence.append(float(q[token]))


def _draft_generator(seed: int, out_pos: int, device: torch.device) -> torch.Generator:
    """A generator that is a pure function of (seed, output position), keyed apart from the
    target's counter-based noise so draft and verification randomness stay independent."""
    digest = hashlib.blake2b(f"draft/{seed}/{out_pos}".encode(), digest_size=8).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)


# ------------------------------------------------------------------------ registration
def _load(config: EngineConfig, target: Target) -> DecoderLM | None:
    """The draft model when one is given (`--proposer draft`, or `auto` with `--draft-model`);
    ValueError naming what differs if it cannot pair with the target."""
    path = config.spec.draft_model
    if path is None:
        return None
    vocab = target.model.arch.vocab_size
    return load_draft_model(
        path, vocab, target.tokenizer, target.device, target.dtype, config.numerics
    )


def _build(loaded: Loaded) -> DraftModelProposer | None:
    """Its pool holds as many blocks as the target's: a sequence's draft KV (n + k - 1
    positions) never outgrows its target KV (n + k) and only running sequences hold any."""
    config = loaded.config
    if config.spec.draft_model is None:
        return None
    if loaded.own_model is None or loaded.target is None:
        raise ValueError("the draft proposer needs its loaded model: see load_resources")
    bs, max_tokens = config.cache.block_size, config.scheduler.max_batch_tokens
    device = loaded.target.device
    return DraftModelProposer(
        loaded.own_model, loaded.num_blocks, bs, device, max_step_tokens=max_tokens
    )


def _artifact_dir(
    settings: Mapping[str, Any], target_dir: Path, live: Proposer | None
) -> Path | None:
    del target_dir, live
    path = settings.get("draft_model")
    return resolve_model_dir(path) if path else None


def _fingerprint(model_dir: Path, cache_dir: Path | None) -> Fingerprint:
    return target_fingerprint(model_dir, cache_dir)


REGISTRATION = Registration(
    "draft",
    _build,
    artifacts=("draft_model",),
    auto=True,
    summary="a smaller model sharing the tokenizer (--draft-model)",
    load_model=_load,
    artifact_dir=_artifact_dir,
    fingerprint=_fingerprint,
)
