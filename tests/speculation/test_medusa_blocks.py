"""Medusa heads on the q8 block kernel (speculation/medusa_blocks.py): the float heads' scores to
q8 tolerance, the same drafts where the float argmax is clear, and outputs unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, quants

from specserve.kernels import ggml
from specserve.models.block_linear import BlockLinear
from specserve.request import SamplingParams, Sequence
from specserve.speculation.medusa import MedusaConfig, MedusaHeads, save_medusa
from specserve.speculation.medusa_blocks import BlockHeads
from specserve.speculation.medusa_proposer import MedusaProposer

pytestmark = pytest.mark.usefixtures("block_kernels")

HIDDEN, VOCAB = 64, 300


def _heads(num_heads: int, layers: int, own: bool, vocab: list[int] | None) -> MedusaHeads:
    heads = MedusaHeads(HIDDEN, num_heads, layers, VOCAB if own else None)
    g = torch.Generator().manual_seed(num_heads * 10 + layers)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    if vocab is not None:
        heads.draft_vocab = torch.tensor(vocab)
    return heads.eval()


def _lm_head(kind: ggml.BlockKind | None) -> torch.nn.Module:
    """The target's lm_head: float, or GGUF blocks of `kind` (Q8_0 or Q4_1)."""
    lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    with torch.no_grad():
        lm_head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(7)))
    if kind is None:
        return lm_head
    weight = lm_head.weight.detach().numpy()
    blocks = torch.from_numpy(quants.quantize(weight, GGMLQuantizationType[kind.name]))
    return BlockLinear(blocks.contiguous(), kind, HIDDEN, None)


VOCAB_IDS = [3, 8, 20, 41, 77, 101, 150, 199, 250, 299, 5]  # 11: not a multiple of 8


@pytest.mark.parametrize("layers", [0, 1, 2])
@pytest.mark.parametrize("own", [False, True])
@pytest.mark.parametrize("vocab", [None, VOCAB_IDS])
@pytest.mark.parametrize("lm_kind", [None, ggml.BlockKind.Q8_0, ggml.BlockKind.Q4_1])
def test_scores_are_the_float_heads_to_q8_tolerance(
    layers: int, own: bool, vocab: list[int] | None, lm_kind: ggml.BlockKind | None
) -> None:
    heads, lm_head = _heads(3, layers, own, vocab), _lm_head(lm_kind)
    hidden = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = heads.logits(hidden, lm_head)  # [5, 3, vocab]
        if vocab is not None:
            want = want[..., heads.draft_vocab]
        got = BlockHeads(heads, lm_head).logits(hidden, 2)  # the first two heads
    assert got.shape == (5, 2, want.shape[-1])
    scale = want.abs().amax().item()
    torch.testing.assert_close(got, want[:, :2], rtol=0, atol=0.04 * scale)


def test_proposer_on_blocks_drafts_the_float_chain_where_its_argmax_is_clear() -> None:
    heads, lm_head = _heads(4, 2, False, VOCAB_IDS), _lm_head(ggml.BlockKind.Q8_0)
    proposer = MedusaProposer(heads, lm_head, blocks=True)
    reference = MedusaProposer(heads, lm_head)
    assert proposer.blocks is not None and reference.blocks is None
    seqs = [Sequence(i, f"r{i}", [1, 2, i + 3], SamplingParams()) for i in range(16)]
    g = torch.Generator().manual_seed(2)
    for s in seqs:
        h = torch.randn(HIDDEN, generator=g)
        proposer.sync(s, h)
        reference.sync(s, h)
    got = proposer.propose(seqs, [4, 2, 0, 3] * 4)
    want = reference.propose(seqs, [4, 2, 0, 3] * 4)
    clear = same = 0
    for d, w in zip(got, want, strict=True):
        assert len(d.tokens) == len(w.tokens) and set(d.tokens) <= set(VOCAB_IDS)
        pairs = zip(d.confidence or [], w.confidence or [], strict=True)
        for t, u, (c, cw) in zip(d.tokens, w.tokens, pairs, strict=True):
            assert c == pytest.approx(cw, abs=0.1)
            if cw > 0.6:  # a clear winner survives q8 rounding
                clear += 1
                same += t == u
    assert clear > 5 and same == clear


def test_lossless_with_block_heads(tmp_path: Path, tiny_llama: Path) -> None:
    """Greedy output identical with q8 Medusa heads on and speculation off; drafts were verified
    and some rejected."""
    from tests.engine.helpers import make_engine, run_all

    heads = MedusaHeads(64, num_heads=3, num_layers=1)  # tiny_llama: hidden 64, vocab 320
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.05)
    save_medusa(heads, tmp_path, MedusaConfig(3, 1, "tiny"))
    prompts = [[1, 5, 9, 5, 9, 5, 9], [1, 40, 41, 42, 40, 41], [1, 7]]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    want = run_all(make_engine(tiny_llama), prompts, params)
    engine = make_engine(tiny_llama, speculate=3, proposer="medusa", medusa=str(tmp_path))
    assert isinstance(engine.proposer, MedusaProposer) and engine.proposer.blocks is not None
    assert run_all(engine, prompts, params) == want
    stats = engine.stats.proposer
    assert stats.drafted_tokens > stats.accepted_tokens
