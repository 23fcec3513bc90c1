"""Stall-free prefill in the engine: with prompt chunks sized to an ITL target (a cost injected,
so no clock decides them) a newcomer's prompt is spread over steps in which the running stream
decodes every time, and every output is the one an unchunked engine gives."""

from __future__ import annotations

from pathlib import Path

from specserve.request import SamplingParams
from specserve.runner.cost import CostCurve, LiveCost, StepCostModel, StepShape
from specserve.scheduler.chunking import MIN_PREFILL_TOKENS
from tests.engine.helpers import make_engine

GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)


class FixedCost(LiveCost):
    """A step cost that does not learn from the steps it sees: the chunks it sizes do not
    depend on how fast this machine runs the tiny model (a live cost would learn that its
    steps take a fraction of a millisecond and fit the whole prompt in one chunk)."""

    def observe(self, shape: StepShape, seconds: float) -> None:
        del shape, seconds


def _slow_prefill() -> LiveCost:
    """A decode row 1 ms, a prompt token 1 ms: 50 ms fits 49 prompt tokens beside one stream."""
    curve = CostCurve((1, 64), (0.001, 0.064))
    return FixedCost(StepCostModel(curve, 0.0, 0.0, per_prefill_token=1e-3, context=0))


def _run(model: Path, itl_target_ms: float, speculate: int) -> tuple[list[list[int]], list[int]]:
    """A stream, and after its third step a 150-token prompt: both outputs, and the prompt
    tokens computed in each step while the stream decoded."""
    cost = _slow_prefill() if itl_target_ms else None
    engine = make_engine(
        model, num_blocks=128, itl_target_ms=itl_target_ms, speculate=speculate, step_cost=cost
    )
    first = engine.add_request([5, 6, 7, 8, 9], GREEDY)
    tokens: dict[str, list[int]] = {first: []}
    chunks = []
    for step in range(10_000):
        if step == 3:
            second = engine.add_request([3 + i % 20 for i in range(150)], GREEDY)
            tokens[second] = []
        if not engine.has_work():
            break
        outs = engine.step()
        record = engine.last_step
        if step >= 3 and record is not None and record.prefill_tokens:
            assert any(o.request_id == first and o.new_token_ids for o in outs)
            chunks.append(record.prefill_tokens)
        for o in outs:
            tokens[o.request_id] += o.new_token_ids
    return list(tokens.values()), chunks


def test_chunks_to_the_itl_target_keep_the_stream_decoding_and_outputs_the_same(
    tiny_llama: Path,
) -> None:
    for speculate in (0, 3):
        whole, chunks_whole = _run(tiny_llama, 0.0, speculate)
        chunked, chunks = _run(tiny_llama, 50.0, speculate)
        assert chunked == whole
        assert len(chunks_whole) == 1 and chunks_whole[0] >= 150  # one step stalled the stream
        assert len(chunks) > 2 and max(chunks) <= 49 and min(chunks) >= 1
        assert max(chunks) >= MIN_PREFILL_TOKENS
