"""The asyncio front: streaming, early exit aborts and frees KV, errors before any output."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from specserve.engine.async_engine import AsyncEngine
from specserve.engine.request import SamplingParams
from tests.engine.helpers import make_engine, run_all


def test_stream_matches_sync_and_early_exit_frees_blocks(tiny_llama: Path) -> None:
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    want = run_all(make_engine(tiny_llama), [[5, 6, 7]], params)[0]
    engine = make_engine(tiny_llama, speculate=3)
    front = AsyncEngine(engine)

    async def main() -> list[int]:
        got: list[int] = []
        async for out in front.generate([5, 6, 7], params):
            got += out.new_token_ids
        async for out in front.generate([8, 9, 10], SamplingParams(max_new_tokens=200)):
            assert not out.finished
            break  # the client went away
        with pytest.raises(ValueError, match="prompt is empty"):
            async for _ in front.generate([], params):
                pass
        for _ in range(200):  # the abort reaches the engine thread between steps
            if front.run_locked(lambda e: not e.has_work()):
                break
            await asyncio.sleep(0.01)
        await front.shutdown()
        return got

    assert asyncio.run(main()) == want
    assert engine.res.allocator.num_free == engine.res.allocator.num_blocks
    assert front.num_active == 0
