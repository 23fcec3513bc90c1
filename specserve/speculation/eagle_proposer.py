"""`EagleProposer`: drafts autoregressively with an EAGLE-style head (eagle_head.py) on the
target's own features, batched over sequences; when it asks the head, what it keeps per
sequence, the head's layer as torch operations over padded tensors, and its registration.

Per sequence it keeps the head's keys and values of verified output positions (the last
`window - 1`) and the pairs (feature, token) that `sync` handed over since the last proposal
(`HeadState`). `propose` first runs those pending pairs (their keys join the cache: computed
from the target's true features) and then drafts k tokens, each from the head's own previous
output (`Chain`); the chain's keys live only for that call. Drafted ids come from the draft
vocabulary only. Where the head's projections are GGUF blocks, the layer runs in one native
call and the keys live in lanes of a cache of the head's own (eagle_native.py), and for greedy
requests the pending pairs and the whole chain are one native call (kernels/eagle_chain.c);
elsewhere as torch operations over padded tensors (`padded_catch_up`, `padded_draft`), on
whatever device the target runs, a CUDA target among them.

Greedy requests without penalties or logits processors draft the head's argmax. Others draft
what the engine's sampler would pick from the head's logits (-inf outside the draft
vocabulary) after the request's processors, penalties, temperature, top-k/p: for a sampled
request that is the Gumbel-max sample under the very noise the target's own sample will use
(a pure function of seed and output position). The draft is accepted iff the target samples the
same token, which is likely where the head's q is close to the target's p, and every output
stays the one the request gets without speculation (no rejection sampler, whose accepted tokens
are distributed right but are not the same tokens).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specserve.kernels import ggml
from specserve.models.block_linear import BlockLinear, linear_weight, q8_linear
from specserve.models.fingerprint import Fingerprint, config_sha256, files_sha256
from specserve.models.llama import DecoderLM
from specserve.models.loader import resolve_model_dir
from specserve.request import History, Sequence
from specserve.runner.sampler import SampleRow, sample_row
from specserve.speculation.calibration import PerSequenceMean
from specserve.speculation.eagle_head import (
    CONFIG_FILE,
    HEAD_FILE,
    NO_POSITION,
    EagleHead,
    check_base,
    eagle_head_dir,
    load_eagle,
    shipped_head_for,
)
from specserve.speculation.eagle_native import Lane, NativeHead, Rows
from specserve.speculation.proposer import Draft, HiddenRows, Loaded, Proposer, Registration

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------- when the head is asked
# When the head is asked to draft in a sequence: what a drafted token costs, and the running
# mean, per sequence, of what asking it has gained (`EagleProposer` gates itself on it;
# `HybridProposer` keeps its own over the drafts the head served).
#
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


# ---------------------------------------------------------------------------- what it keeps
# Draft another token only while the head gives the chain so far at least this probability of
# being accepted whole: below it, the next token's expected gain (its probability times this)
# is worth less than drafting and verifying it (bench_eagle: ~0.1-0.2 of a target step each).
CONTINUE_ABOVE = 0.35


@dataclass
class HeadState:
    """One sequence's, across `propose` calls: the head's keys of verified positions and the
    pairs pending since, trimmed to the window."""

    num_tokens: int = 0  # seq.num_tokens when last synced
    features: list[torch.Tensor] = field(default_factory=list)  # pending pairs' [n, H] features
    tokens: list[int] = field(default_factory=list)  # pending pairs' tokens
    next_pos: int = 0  # output position of the next pending pair
    keys: torch.Tensor | None = None  # [kv_heads, L, D] of verified positions
    values: torch.Tensor | None = None
    positions: torch.Tensor | None = None  # [L]
    last: torch.Tensor | None = None  # the head's output at the newest verified position
    drafted: list[int] = field(default_factory=list)  # the last draft, until its outcome is seen
    lane: Lane | None = None  # its slots in the native path's cache (eagle_native.py)
    sat_out: int = 0  # steps not asked since its gate closed (HEAD_RECHECK)
    recheck: int = HEAD_RECHECK  # steps to sit out before asking again (doubling)

    def recheck_due(self) -> bool:
        """Count a step its closed gate kept the head from drafting; True on the step it has
        sat out `recheck` of them (then the next wait doubles)."""
        self.sat_out += 1
        if self.sat_out < self.recheck:
            return False
        self.sat_out, self.recheck = 0, min(2 * self.recheck, HEAD_RECHECK_MAX)
        return True

    def drop_unseen(self, keep: int) -> None:
        """Drop the pending pairs no future query can see (all but the last `keep`): whole
        feature tensors from the front, then a view of the first one's tail. Without
        concatenating: a sequence the head is not asked for stays past the window every step,
        and joining its pending rows each time cost more than the rest of `sync` (a timing
        probe: ~12 of ~20 us)."""
        excess = len(self.tokens) - keep
        if excess <= 0:
            return
        self.next_pos += excess
        del self.tokens[:excess]
        while excess:
            first = self.features[0]
            if len(first) > excess:
                self.features[0] = first[excess:]
                break
            self.features.pop(0)
            excess -= len(first)


@dataclass
class Chain:
    """One sequence's drafts in a `propose` call."""

    seq: Sequence
    k: int  # the most tokens to draft
    tokens: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    dead: bool = False  # the request's processors allowed no draft id: nothing more to add
    reach: float = 1.0  # the head's probability of the whole chain so far

    @property
    def plain(self) -> bool:
        """Greedy with nothing that changes the argmax: the head's own top token."""
        p = self.seq.params
        return p.plain_greedy and not self.seq.logits_processors

    def add(self, token: int, confidence: float) -> None:
        self.tokens.append(token)
        self.confidence.append(confidence)
        self.reach *= confidence

    def done(self) -> bool:
        """Drafted k, or the chain is too unlikely to be accepted this far for another token
        to pay for its drafting (EAGLE-2's dynamic depth, on a chain)."""
        return self.dead or len(self.tokens) >= self.k or self.reach < CONTINUE_ABOVE

    def sample(self, logits: torch.Tensor, vocab: torch.Tensor, vocab_size: int, j: int) -> int:
        """The engine sampler's pick from the head's logits (see the module docstring)."""
        seq = self.seq
        full = torch.full((vocab_size,), float("-inf"), device=logits.device)
        full[vocab] = logits
        history = History(seq, list(self.tokens))  # a view: nothing of the context copied
        row = SampleRow(seq.params, history, len(seq.output_ids) + j, seq.logits_processors)
        picked = sample_row(full, row)
        if not math.isfinite(picked.logprob):  # the request allows no draft id: the chain ends
            self.dead = True
            return 0
        self.add(picked.token, math.exp(picked.logprob))
        return picked.token

    def draft(self) -> Draft:
        return Draft(tokens=self.tokens, confidence=self.confidence)


# ----------------------------------------------------------------------------- the proposer
class EagleProposer(Proposer):
    name = "eagle"

    def __init__(
        self,
        head: EagleHead,
        target: DecoderLM,
        head_dir: Path | None,
        blocks: bool = False,
    ) -> None:
        """`blocks`: run the head's projections and the draft-vocabulary scores on the Q8_0
        block kernel in the q8 numerics (the target's own lm_head blocks where it has them):
        drafting is memory-bound at a few rows, and that reads a quarter of float32's bytes."""
        # the head runs where the target does (its features and embeddings are there)
        self.device = _device(target)
        self.head, self.target, self.head_dir = head.to(self.device), target, head_dir
        self.vocab = head.draft_vocab  # [K]
        lm_head = target.lm_head
        self.vocab_logits: nn.Module  # [..., H] -> [..., K]: the target's lm_head rows
        if blocks and isinstance(lm_head, BlockLinear):
            kind, width = lm_head.kind, lm_head.in_features
            rows = ggml.gather_rows(lm_head.blocks, kind, self.vocab, width)
            self.vocab_logits = BlockLinear(rows, kind.plain, width, None)
        else:
            self.vocab_logits = nn.Linear(
                head.shape.hidden_size, len(self.vocab), bias=False, device=self.device
            )
            rows = linear_weight(lm_head).detach()[self.vocab].float()
            self.vocab_logits.weight = nn.Parameter(rows, requires_grad=False)
            if blocks:
                self.vocab_logits = q8_linear(self.vocab_logits)
        if blocks:
            for name in ("fc", "qkv", "o", "gate_up", "down"):
                setattr(head, name, q8_linear(getattr(head, name)))
        # the layer in one native call per drafting step where its projections allow it
        self.native = NativeHead(head) if blocks and NativeHead.supports(head) else None
        # A drafted token's embedding, by its place in the draft vocabulary: the target's rows,
        # decoded once (bit for bit what `_embed` gives), so a chain step indexes one table
        # instead of gathering and decoding GGUF rows (~6 framework calls, each several times its
        # warm cost at batch 1, where the target's forward has just evicted the caches).
        with torch.inference_mode():
            self.vocab_embed = self._embed(self.vocab).contiguous()  # [K, H]
        self._vocab_ids: list[int] = self.vocab.tolist()
        self._vocab_place = {t: i for i, t in enumerate(self._vocab_ids)}
        self._states: dict[int, HeadState] = {}
        # per sequence and draft: tokens accepted less what drafting them cost; `gated` off
        # where a caller decides itself where to ask (the hybrid: the head is asked only where
        # its draft may serve, and the tokens verified may be the lookup's)
        self.gained = head_mean()
        self.gated = True

    @classmethod
    def load(
        cls, head_dir: Path, target: DecoderLM, base_dir: Path, force: bool = False
    ) -> EagleProposer:
        head, cfg = load_eagle(head_dir)
        arch = target.arch
        if (cfg.shape.hidden_size, cfg.shape.head_dim) != (arch.hidden_size, arch.head_dim) or (
            int(head.draft_vocab.max()) >= arch.vocab_size
        ):
            raise ValueError(
                f"EAGLE head {head_dir} (hidden {cfg.shape.hidden_size}) does not fit base "
                f"{base_dir} (hidden {arch.hidden_size}, vocab {arch.vocab_size})"
            )
        check_base(head_dir, cfg, base_dir, force)
        widths = (cfg.shape.hidden_size, cfg.shape.intermediate_size)
        on_cpu = _device(target).type == "cpu"  # the block kernels run on the CPU
        blocks = on_cpu and ggml.library() is not None and all(w % ggml.QK == 0 for w in widths)
        logger.info(
            "EAGLE: head with %d draft ids from %s (%s)",
            len(head.draft_vocab),
            head_dir,
            "Q8_0 blocks, q8" if blocks else "float32",
        )
        return cls(head, target, head_dir, blocks)

    # ------------------------------------------------------------------------- protocol
    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        if seq.params.speculate == 0:  # it never drafts: no features to keep
            return
        # a copy: a view would keep the whole step's hidden states alive until the next proposal
        # (clone: ~4 us against ~14 for `.to(float32, copy=True)` on a float32 row)
        rows = hidden.detach().reshape(-1, hidden.shape[-1])
        rows = rows.clone() if rows.dtype == torch.float32 else rows.float()
        n = len(seq.output_ids)
        if len(rows) > n:
            raise ValueError(f"{len(rows)} feature rows for {n} output tokens")
        start = n - len(rows)  # output position of the first row
        state = self._states.get(seq.seq_id)
        if state is None or state.next_pos + len(state.tokens) != start:  # new, or a gap:
            # start over from here; a lane is kept: its keys are not used again (make_room)
            lane = state.lane if state is not None else None
            self._states[seq.seq_id] = state = HeadState(next_pos=start, lane=lane)
        if state.drafted and self.gated:  # what the last draft gained: the rows past the
            # step's own token are its accepted tokens (none where the policy verified none)
            self.gained.record(seq.seq_id, len(rows) - 1 - HEAD_TOKEN_COST * len(state.drafted))
            if self.gained.mean(seq.seq_id) > 0.0:  # paying (again): a later stop rechecks soon
                state.recheck = HEAD_RECHECK
        state.drafted = []
        state.features.append(rows)
        state.tokens += seq.output_ids[start:]
        state.drop_unseen(self.head.shape.window)
        state.num_tokens = seq.num_tokens

    def reset(self) -> bool:
        """Forget what the gate learned from earlier requests: a benchmark cell after another
        workload starts where the first did (after three code workloads on one engine the
        head's shared mean had closed it on chat-creative: 0.99x N = 0 against 1.22x fresh)."""
        self.gained.forget()
        return True

    def release(self, seq: Sequence) -> None:
        state = self._states.pop(seq.seq_id, None)
        self.gained.release(seq.seq_id)
        if state is not None and state.lane is not None and self.native is not None:
            self.native.release(state.lane)

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        """Drafts where the head's drafts have been gaining tokens in the sequence (or its
        gate is due a recheck)."""
        drafts = [Draft(tokens=[]) for _ in seqs]
        rows = [
            i
            for i, (s, k) in enumerate(zip(seqs, ks, strict=True))
            if k and self._ready(s) and (not self.gated or self._gate_open(s.seq_id))
        ]
        if not rows:
            return drafts
        with torch.inference_mode():
            states = [self._states[seqs[i].seq_id] for i in rows]
            asked, asked_ks = [seqs[i] for i in rows], [ks[i] for i in rows]
            chains = self._greedy_native(asked, asked_ks, states)
            if chains is None:
                self._catch_up(states)
                chains = self._draft(asked, asked_ks, states)
        for i, draft, state in zip(rows, chains, states, strict=True):
            drafts[i], state.drafted = draft, draft.tokens
        return drafts

    def _gate_open(self, seq_id: int) -> bool:  # gaining there, or due a recheck
        return self.gained.mean(seq_id) > 0.0 or self._states[seq_id].recheck_due()

    def _ready(self, seq: Sequence) -> bool:
        state = self._states.get(seq.seq_id)
        return (
            state is not None
            and state.num_tokens == seq.num_tokens
            and (bool(state.tokens) or state.last is not None)
        )

    # -------------------------------------------------------------------------- drafting
    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, H]
        flat = self.target.embed_tokens(tokens.reshape(-1))
        return flat.float().view(*tokens.shape, -1)

    def _embed_committed(self, tokens: list[int]) -> torch.Tensor:  # -> [T, H]
        """Embeddings of committed tokens: from `vocab_embed` where all are draft ids (most
        text), the same values in fewer framework calls; else decoded from the target's."""
        places = [self._vocab_place.get(t, -1) for t in tokens]
        if -1 in places:
            return self._embed(torch.tensor(tokens, device=self.device))
        return self.vocab_embed[torch.tensor(places, device=self.device)]

    def _catch_up(self, states: list[HeadState]) -> None:
        """Run every pending pair: keys into the caches, each state's `last` output."""
        todo = [s for s in states if s.tokens]
        if not todo:
            return
        if self.native is not None:
            self._run_native(todo, [0] * len(todo), self.native)
            return
        padded_catch_up(self.head, self._embed, todo, self.device)

    def _run_native(
        self, states: list[HeadState], ks: list[int], native: NativeHead
    ) -> list[tuple[list[int], list[float]]]:
        """One native call (NativeHead.chain): every state's pending pairs (their keys kept,
        `last` updated), then greedy chains of up to ks tokens (none where all are 0)."""
        assert isinstance(self.vocab_logits, BlockLinear)  # blocks: the native path's
        rows = Rows([], [s.next_pos for s in states], [len(s.tokens) for s in states])
        for s, count in zip(states, rows.counts, strict=True):
            s.lane = s.lane or native.lane(s.next_pos)
            # every row runs while any chain drafts on: room for the longest chain in each lane
            native.make_room(s.lane, s.next_pos, count + max(ks))
            rows.lanes.append(s.lane)
        tokens = [t for s in states for t in s.tokens]
        pending = None
        if tokens:
            feats = torch.cat([f for s in states for f in s.features])
            pending = (feats, self._embed_committed(tokens))
        blank = torch.zeros(self.head.shape.hidden_size, device=self.device)
        g = torch.stack([blank if s.last is None else s.last for s in states])  # new: scratch
        above = CONTINUE_ABOVE
        last, found = native.chain(g, rows, pending, ks, self.vocab_logits, self.vocab_embed, above)
        for b, (s, count) in enumerate(zip(states, rows.counts, strict=True)):
            if count:
                s.last, s.next_pos, s.features, s.tokens = last[b], s.next_pos + count, [], []
        return found

    def _greedy_native(
        self, seqs: list[Sequence], ks: list[int], states: list[HeadState]
    ) -> list[Draft] | None:
        """Greedy chains on the native head: the pending pairs and the whole chain in one call;
        None where a chain samples (the Python loop drafts those)."""
        native, picks = self.native, [Chain(seq, k) for seq, k in zip(seqs, ks, strict=True)]
        if native is None or not all(c.plain for c in picks):
            return None
        ks = [min(k, native.max_chain) for k in ks]
        if max(len(s.tokens) for s in states) + max(ks) > native.max_chain:
            self._catch_up(states)  # a lane could not hold both: its pairs go in first
        for chain, (places, probs) in zip(picks, self._run_native(states, ks, native), strict=True):
            for place, prob in zip(places, probs, strict=True):
                chain.add(self._vocab_ids[place], prob)
        return [c.draft() for c in picks]

    def _draft(self, seqs: list[Sequence], ks: list[int], states: list[HeadState]) -> list[Draft]:
        if self.native is not None:
            return self._draft_native(seqs, ks, states, self.native)
        return padded_draft(self.head, self.vocab_embed, self._pick, seqs, ks, states, self.device)

    def _draft_native(
        self, seqs: list[Sequence], ks: list[int], states: list[HeadState], native: NativeHead
    ) -> list[Draft]:
        ks = [min(k, native.max_chain) for k in ks]
        lanes = []
        for s in states:
            assert s.lane is not None  # caught up at least once: `last` is there
            # every row runs while any chain drafts on: room for the longest chain in each lane
            native.make_room(s.lane, s.next_pos, max(ks))
            lanes.append(s.lane)
        g = torch.stack([s.last for s in states if s.last is not None])  # [B, H]
        picks = [Chain(seq, k) for seq, k in zip(seqs, ks, strict=True)]
        for j in range(max(ks)):
            places = self._pick(g, picks, j)  # [B]
            if all(c.done() for c in picks):
                break
            x = self.head.fuse(g, self.vocab_embed[places])
            g = native.forward(x, Rows(lanes, [s.next_pos + j for s in states], [1] * len(lanes)))
        return [c.draft() for c in picks]

    def _pick(self, g: torch.Tensor, chains: list[Chain], j: int) -> torch.Tensor:
        """The j-th draft token of every chain from the head's outputs g [B, H], as its place
        in the draft vocabulary [B] (`vocab_embed`'s row). Few framework calls: at batch 1 each
        costs several times its warm cost right after the target's forward (bench_eagle)."""
        logits = self.vocab_logits(g)  # [B, K]
        prob, top = torch.softmax(logits, -1).max(-1)
        places, probs = top.tolist(), prob.tolist()
        for b, chain in enumerate(chains):
            if chain.done():  # its batch-mates draft on; its token only feeds the next step
                continue
            if chain.plain:
                chain.add(self._vocab_ids[places[b]], probs[b])
            else:
                token = chain.sample(logits[b], self.vocab, self.target.arch.vocab_size, j)
                places[b] = self._vocab_place.get(token, 0)  # (not a draft id: a dead chain)
        return torch.tensor(places, device=self.device)


def _device(target: DecoderLM) -> torch.device:
    """Where the target computes (its token embeddings, which the head reads, live there)."""
    embed = target.embed_tokens  # nn.Embedding, or GGUF blocks (a buffer, no weight)
    return next(itertools.chain(embed.parameters(), embed.buffers())).device


# --------------------------------------------------------------------------- the torch path
# The head's layer as torch operations over padded tensors, on any device: the path the proposer
# takes where the head's projections are not GGUF blocks for the native call (eagle_native.py).
# `padded_catch_up` runs each sequence's pending (feature, token) pairs against its cached keys
# and keeps the last `window - 1` of them; `padded_draft` then extends every chain one token a
# step from the head's own previous output, the chain's keys living only for that call.
PAD_QUERY = 1 << 40  # the position of a padded query row (sees every key; its output is unused)

Embed = Callable[[torch.Tensor], torch.Tensor]  # token ids [...] -> float32 embeddings [..., H]
# outputs [B, H] -> each chain's next token, as its place in the draft vocabulary [B]
Pick = Callable[[torch.Tensor, list[Chain], int], torch.Tensor]


def padded_cache(
    head: EagleHead, states: list[HeadState], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The states' caches right-padded to one length: keys, values [B, kv_heads, P, D] and
    positions [B, P] (NO_POSITION where empty)."""
    kv_heads, head_dim = head.shape.num_kv_heads, head.shape.head_dim
    length = max((len(s.positions) for s in states if s.positions is not None), default=0)
    keys = torch.zeros(len(states), kv_heads, length, head_dim, device=device)
    values = torch.zeros_like(keys)
    positions = torch.full((len(states), length), NO_POSITION, dtype=torch.long, device=device)
    for b, s in enumerate(states):
        if s.keys is not None and s.values is not None and s.positions is not None:
            n = len(s.positions)
            keys[b, :, :n], values[b, :, :n], positions[b, :n] = s.keys, s.values, s.positions
    return keys, values, positions


def padded_catch_up(
    head: EagleHead, embed: Embed, todo: list[HeadState], device: torch.device
) -> None:
    """Run every pending pair of `todo`: keys into the caches, each state's `last` output."""
    t = max(len(s.tokens) for s in todo)
    feats = torch.zeros(len(todo), t, head.shape.hidden_size, device=device)
    ids = torch.zeros(len(todo), t, dtype=torch.long, device=device)
    q_pos = torch.full((len(todo), t), PAD_QUERY, dtype=torch.long, device=device)
    for b, s in enumerate(todo):
        n = len(s.tokens)
        feats[b, :n] = torch.cat(s.features)
        ids[b, :n] = torch.tensor(s.tokens, device=device)
        q_pos[b, :n] = torch.arange(s.next_pos, s.next_pos + n, device=device)
    x = head.fuse(feats, embed(ids))
    q, k, v = head.qkv_at(x, q_pos)
    k_pos = torch.where(q_pos == PAD_QUERY, NO_POSITION, q_pos)
    past_k, past_v, past_pos = padded_cache(head, todo, device)
    keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    allowed = head.window_mask(q_pos, torch.cat([past_pos, k_pos], dim=1))
    allowed |= (q_pos == PAD_QUERY).unsqueeze(2)
    out = head.finish(x, head.attend(q, keys, values, allowed))
    keep = head.shape.window - 1
    for b, s in enumerate(todo):
        n = len(s.tokens)
        valid = past_pos[b] != NO_POSITION
        s.keys = torch.cat([past_k[b][:, valid], k[b, :, :n]], dim=1)[:, -keep:]
        s.values = torch.cat([past_v[b][:, valid], v[b, :, :n]], dim=1)[:, -keep:]
        s.positions = torch.cat([past_pos[b][valid], q_pos[b, :n]])[-keep:]
        s.last = out[b, n - 1]
        s.next_pos += n
        s.features, s.tokens = [], []


def padded_draft(
    head: EagleHead,
    vocab_embed: torch.Tensor,
    pick: Pick,
    seqs: list[Sequence],
    ks: list[int],
    states: list[HeadState],
    device: torch.device,
) -> list[Draft]:
    """Up to ks[i] tokens per sequence, each drafted from the head's output at the one before;
    `vocab_embed` [K, H]: the draft vocabulary's embeddings, by place."""
    g = torch.stack([s.last for s in states if s.last is not None]).unsqueeze(1)  # [B, 1, H]
    past_k, past_v, past_pos = padded_cache(head, states, device)
    pos = torch.tensor([s.next_pos for s in states], device=device).unsqueeze(1)  # [B, 1]
    picks = [Chain(seq, k) for seq, k in zip(seqs, ks, strict=True)]
    for j in range(max(ks)):
        places = pick(g[:, 0], picks, j)  # [B]
        if all(c.done() for c in picks):
            break
        x = head.fuse(g, vocab_embed[places].unsqueeze(1))
        q, k, v = head.qkv_at(x, pos)
        past_k, past_v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        past_pos = torch.cat([past_pos, pos], dim=1)
        g = head.finish(x, head.attend(q, past_k, past_v, head.window_mask(pos, past_pos)))
        pos = pos + 1
    return [c.draft() for c in picks]


# ----------------------------------------------------------------------------- registration
def eagle_proposer(loaded: Loaded) -> EagleProposer | None:
    """The EAGLE proposer for the loaded target; None when no head serves it (logged)."""
    spec, target = loaded.config.spec, loaded.target
    if target is None:
        return None
    head_dir = eagle_head_dir(target.model_dir, spec.eagle)
    if head_dir is None:
        logger.info(
            "--proposer %s: no EAGLE head for %s (pass --eagle DIR; specserve train-eagle "
            "makes one); n-gram serves",
            spec.proposer,
            target.model_dir,
        )
        return None
    return EagleProposer.load(head_dir, target.model, target.model_dir, spec.force_eagle)


def _artifact_dir(settings: Mapping[str, Any], target_dir: Path, live: Proposer | None) -> Path:
    head_dir = getattr(live, "head_dir", None)
    if isinstance(head_dir, Path):
        return head_dir
    eagle = settings.get("eagle")
    if eagle:
        return Path(eagle)
    return shipped_head_for(resolve_model_dir(str(target_dir))) or target_dir


def fingerprint_head(head_dir: Path, cache_dir: Path | None) -> Fingerprint:
    config = head_dir / CONFIG_FILE
    return {
        "config_sha256": config_sha256(config) if config.is_file() else None,
        "weights_sha256": files_sha256(
            [p for p in [head_dir / HEAD_FILE] if p.is_file()], cache_dir
        ),
    }


REGISTRATION = Registration(
    "eagle",
    eagle_proposer,
    artifacts=("eagle", "force_eagle"),
    hidden=HiddenRows.ACCEPTED,
    summary="an EAGLE-style head on the target's features (--eagle DIR, or the shipped head "
    "for the default model)",
    artifact_dir=_artifact_dir,
    fingerprint=fingerprint_head,
)
