"""The asyncio front: streaming, early exit aborts and frees KV, errors before any output."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from specserve.engine.async_engine import AsyncEngine
from specserve.engine.engine import Engine
from specserve.engine.request import RequestOutput, SamplingParams
from specserve.engine.resources import load_resources
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


def test_a_dead_step_thread_fails_open_requests_and_refuses_new_ones(tiny_llama: Path) -> None:
    front = AsyncEngine(make_engine(tiny_llama, num_blocks=256))

    async def main() -> None:
        stream = front.generate([5, 6, 7], SamplingParams(max_new_tokens=400, ignore_eos=True))
        first = await anext(stream)
        assert not first.finished

        def broken(item: object) -> None:
            raise RuntimeError("loop bug")

        front._apply = broken  # type: ignore[method-assign]
        front.abort("nobody")  # wakes the loop, which now dies on this item
        last = first
        async with asyncio.timeout(10):  # before the fix: hangs for ever
            async for out in stream:
                last = out
        assert last.finished and last.finish_reason == "error"
        assert "the engine stopped: RuntimeError: loop bug" in (last.error or "")
        assert not front.alive and front.died == "RuntimeError: loop bug"
        with pytest.raises(RuntimeError, match="the engine stopped"):
            async for _ in front.generate([5, 6], SamplingParams(max_new_tokens=2)):
                pass

    asyncio.run(main())


def test_shutdown_aborts_what_outlives_its_timeout(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, num_blocks=256)
    step = engine.step

    def floored_step() -> list[RequestOutput]:  # 500 tokens outlast the 0.2 s on any machine
        outputs = step()
        time.sleep(0.005)
        return outputs

    engine.step = floored_step  # type: ignore[method-assign]
    front = AsyncEngine(engine)

    async def main() -> tuple[bool, RequestOutput]:
        stream = front.generate([5, 6, 7], SamplingParams(max_new_tokens=500, ignore_eos=True))
        last = await anext(stream)
        stop = asyncio.ensure_future(front.shutdown(timeout=0.2, grace=10))
        async for out in stream:
            last = out
        return await stop, last

    stopped, last = asyncio.run(main())
    assert stopped and not front.alive
    assert last.finish_reason == "abort" and last.num_output_tokens < 500
    assert "shut down before this request finished" in (last.error or "")
    assert engine.res.allocator.num_free == engine.res.allocator.num_blocks


class ConcurrencyProbe:
    """Wraps a tokenizer; counts calls that start while another thread is inside it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.inside = 0
        self.overlaps = 0
        self.threads: set[str] = set()
        self._guard = threading.Lock()

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._guard:
            self.inside += 1
            self.overlaps += self.inside > 1
            self.threads.add(threading.current_thread().name)
        try:
            time.sleep(0.001)  # widen the window a race needs
            return fn(*args, **kwargs)
        finally:
            with self._guard:
                self.inside -= 1

    def encode(self, text: str, **kwargs: Any) -> Any:
        return self._call(self.inner.encode, text, **kwargs)

    def decode(self, ids: list[int], **kwargs: Any) -> Any:
        return self._call(self.inner.decode, ids, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_tokenizer_is_never_entered_by_two_threads_at_once(tiny_llama: Path) -> None:
    config = make_engine(tiny_llama).config
    res = load_resources(config)
    probe = ConcurrencyProbe(res.tokenizer)
    res.tokenizer = probe
    front = AsyncEngine(Engine(config, res))

    async def main() -> None:
        params = SamplingParams(max_new_tokens=60, ignore_eos=True)
        consumer = asyncio.ensure_future(_drain(front.generate([5, 6, 7], params)))
        while not consumer.done():  # the event loop encodes while the step thread decodes
            front.engine.encode("def add(a, b): return a + b")
            await asyncio.sleep(0)
        await consumer
        await front.shutdown()

    asyncio.run(main())
    assert {"MainThread", "specserve-engine"} <= probe.threads
    assert probe.overlaps == 0


async def _drain(stream: AsyncIterator[RequestOutput]) -> None:
    async for _ in stream:
        pass


def test_the_locked_tokenizer_pickles_with_a_lock_of_its_own(tiny_llama: Path) -> None:
    """A fleet replica sends its (locked) tokenizer to the ingress."""
    import pickle

    from transformers import AutoTokenizer

    from specserve.engine.tokenizer import LockedTokenizer, locked

    tok = locked(AutoTokenizer.from_pretrained(str(tiny_llama)))
    copy = pickle.loads(pickle.dumps(tok))
    assert isinstance(copy, LockedTokenizer) and copy.lock is not tok.lock
    assert copy.encode("def add(a, b):") == tok.encode("def add(a, b):")
