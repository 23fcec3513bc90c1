"""`EagleProposer`: drafts autoregressively with an EAGLE-style head (eagle_head.py) on the
target's own features, batched over sequences. What it keeps per sequence and when it asks the
head are in eagle_state.py; its drafting on the native layer, in eagle_lanes.py, and as torch
operations, in eagle_padded.py; its registration, in eagle_registration.py.

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
from pathlib import Path

import torch
from torch import nn

from specserve.kernels import ggml
from specserve.models.block_linear import BlockLinear, linear_weight, q8_linear
from specserve.models.llama import DecoderLM
from specserve.request import Sequence
from specserve.speculation.eagle_head import (
    EagleHead,
    check_base,
    load_eagle,
)
from specserve.speculation.eagle_lanes import lanes_draft, lanes_run
from specserve.speculation.eagle_native import NativeHead
from specserve.speculation.eagle_padded import padded_catch_up, padded_draft
from specserve.speculation.eagle_state import (
    CATCH_UP_MAX,
    HEAD_RECHECK,
    HEAD_TOKEN_COST,
    Chain,
    HeadState,
    head_mean,
)
from specserve.speculation.proposer import Draft, Proposer

logger = logging.getLogger(__name__)


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
        # No copy: the step's rows are a tensor of their own (the runner gathers them) that
        # nothing writes to later; a view keeps it alive while a pair pending here points into
        # it (at most CATCH_UP_MAX steps'). Per sequence and step: shape[0], not len() (~1.4 us
        # each), and no reshape of 2-D rows.
        rows = hidden.detach()
        rows = rows if rows.dim() == 2 else rows.reshape(-1, rows.shape[-1])
        rows = rows if rows.dtype == torch.float32 else rows.float()
        n, count = len(seq.output_ids), rows.shape[0]
        if count > n:
            raise ValueError(f"{count} feature rows for {n} output tokens")
        start = n - count  # output position of the first row
        state = self._states.get(seq.seq_id)
        if state is None or state.next_pos + len(state.tokens) != start:  # new, or a gap:
            # start over from here; a lane is kept: its keys are not used again (make_room)
            lane = state.lane if state is not None else None
            self._states[seq.seq_id] = state = HeadState(next_pos=start, lane=lane)
        if state.drafted and self.gated:  # what the last draft gained: the rows past the
            # step's own token are its accepted tokens (none where the policy verified none)
            self.gained.record(seq.seq_id, count - 1 - HEAD_TOKEN_COST * len(state.drafted))
            if self.gained.mean(seq.seq_id) > 0.0:  # paying (again): a later stop rechecks soon
                state.recheck = HEAD_RECHECK
        state.drafted = []
        state.features.append(rows)
        state.tokens += seq.output_ids[start:]
        state.drop_unseen(self.head.shape.window)
        if len(state.tokens) > CATCH_UP_MAX:  # sitting out: asked again, only the latest go in
            state.start_over(CATCH_UP_MAX)
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
        """The states' pending pairs, then greedy chains of up to ks tokens (`lanes_run`)."""
        assert isinstance(self.vocab_logits, BlockLinear)  # blocks: the native path's
        tokens = [t for s in states for t in s.tokens]
        embeds = self._embed_committed(tokens) if tokens else None
        return lanes_run(native, states, ks, embeds, self.vocab_logits, self.vocab_embed)

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
        head, embed, pick = self.head, self.vocab_embed, self._pick
        if self.native is not None:
            return lanes_draft(self.native, head, embed, pick, seqs, ks, states)
        return padded_draft(head, embed, pick, seqs, ks, states, self.device)

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
