"""The asyncio front: streaming, early exit aborts and frees KV, errors before any output."""

from __future__ import annotations

import asyncio
import contextvars
import platform
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVarTuple

import pytest

from specserve.engine.async_engine import AsyncEngine
from specserve.engine.engine import Engine
from specserve.engine.resources import load_resources
from specserve.engine.step_thread import one_malloc_arena
from specserve.outputs import RequestOutput
from specserve.request import SamplingParams
from tests.engine.helpers import make_engine, run_all
from tests.engine.observers import LoopBug, OutputSteps, StepFloor

_Ts = TypeVarTuple("_Ts")


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

        front.run_locked(lambda e: e.observers.add(LoopBug()))  # the next step dies
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
    engine.observers.add(StepFloor(0.005))  # 500 tokens outlast the 0.2 s on any machine
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


def test_non_streaming_gets_first_and_last_output_with_everything(tiny_llama: Path) -> None:
    """stream=False: two outputs (the first token, then the finish carrying the rest); tokens,
    text, log-probabilities and counts as the streamed outputs add up to."""
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, logprobs=2, prompt_logprobs=True)
    # static drafts: both runs verify the same rows. This dense float32 model's GEMMs round a
    # row by the step's shape (only the block kernels are batch-invariant), and the adaptive
    # default's choices follow measured step times, so its two runs could differ in the 7th digit.
    front = AsyncEngine(make_engine(tiny_llama, speculate=3, policy="static"))

    async def collect(stream: bool) -> list[RequestOutput]:
        return [out async for out in front.generate([5, 6, 7, 5, 6], params, stream=stream)]

    async def main() -> tuple[list[RequestOutput], list[RequestOutput]]:
        streamed = await collect(True)
        whole = await collect(False)
        await front.shutdown()
        return streamed, whole

    streamed, whole = asyncio.run(main())
    assert len(streamed) > 2 and len(whole) == 2
    first, last = whole
    assert first.new_token_ids and not first.finished and last.finished
    streamed_ids = [t for o in streamed for t in o.new_token_ids]
    assert first.new_token_ids + last.new_token_ids == streamed_ids
    assert first.new_text + last.new_text == "".join(o.new_text for o in streamed)
    assert (first.logprobs or []) + (last.logprobs or []) == [
        lp for o in streamed for lp in o.logprobs or []
    ]
    assert first.prompt_logprobs == streamed[0].prompt_logprobs is not None
    for field in ("num_output_tokens", "drafted_tokens", "accepted_tokens", "finish_reason"):
        assert getattr(last, field) == getattr(streamed[-1], field), field
    assert streamed[-1].drafted_tokens > 0  # the merged counts are not all zeros


def test_one_wake_up_per_step_for_all_requests(tiny_llama: Path) -> None:
    from specserve.engine.handover import hand_over

    engine = make_engine(tiny_llama)
    counted = OutputSteps()
    engine.observers.add(counted)
    front = AsyncEngine(engine)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        wake_ups = 0
        call = loop.call_soon_threadsafe

        def counted(
            callback: Callable[[*_Ts], object],
            *args: *_Ts,
            context: contextvars.Context | None = None,
        ) -> asyncio.Handle:
            nonlocal wake_ups
            wake_ups += callback is hand_over  # not the executor's own wake-ups
            return call(callback, *args, context=context)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]

        async def one(prompt: list[int]) -> int:
            return sum([len(o.new_token_ids) async for o in front.generate(prompt, params)])

        made = await asyncio.gather(*(one([5 + i, 6, 7]) for i in range(4)))
        assert made == [16] * 4
        await front.shutdown()
        return wake_ups

    wake_ups = asyncio.run(main())
    steps = counted.steps
    assert steps >= 16 and wake_ups <= steps  # four requests' outputs, one wake-up a step


def test_hand_over_is_done_once_every_consumer_came_back() -> None:
    """The step thread's wait ends only once each consumer a hand-over woke has done its work
    (however many loop passes framing and the socket write take) and come back for more."""
    from specserve.engine.handover import Outputs, hand_over

    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        queues: list[Outputs] = [asyncio.Queue() for _ in range(3)]
        done = threading.Event()
        seen: list[bool] = []

        async def consumer(q: Outputs, hops: int) -> None:
            _, ticket = await q.get()
            for _ in range(hops):  # framing, middleware, the write: passes of the loop
                await asyncio.sleep(0)
            seen.append(done.is_set())
            ticket.release()

        tasks = [asyncio.ensure_future(consumer(q, 2 + 3 * i)) for i, q in enumerate(queues)]
        await asyncio.sleep(0)  # every consumer waits on its queue
        out = RequestOutput("r", [1], "a", False, None, 1, 1)
        items = [(q, out) for q in queues]
        await asyncio.to_thread(loop.call_soon_threadsafe, hand_over, items, done)
        await asyncio.gather(*tasks)
        assert done.is_set()  # the last one back set it, on the loop
        return seen

    assert asyncio.run(main()) == [False, False, False]


def test_generate_releases_its_ticket_when_the_caller_comes_back_or_leaves(
    tiny_llama: Path,
) -> None:
    from specserve.engine.handover import Ticket

    released: list[int] = []
    release = Ticket.release

    def counted(self: Ticket) -> None:
        released.append(1)
        release(self)

    front = AsyncEngine(make_engine(tiny_llama))
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)

    async def main() -> int:
        outputs = [o async for o in front.generate([5, 6, 7], params)]
        early = front.generate([5, 6, 8], params)
        await anext(early)  # the caller leaves after its first output
        await early.aclose()
        await front.shutdown()
        return len(outputs)

    try:
        Ticket.release = counted  # type: ignore[method-assign]
        finished = asyncio.run(main())
    finally:
        Ticket.release = release  # type: ignore[method-assign]
    assert len(released) == finished + 1  # every output's ticket, the abandoned one's too


def test_the_step_thread_builds_the_engine_and_its_errors_reach_the_caller(
    tiny_llama: Path,
) -> None:
    """Built where it will run its parallel regions (see the module docstring)."""
    built_in: list[str] = []

    def build() -> Engine:
        built_in.append(threading.current_thread().name)
        return make_engine(tiny_llama)

    front = AsyncEngine(build)
    assert built_in == ["specserve-engine"] and front.alive

    async def main() -> int:
        params = SamplingParams(max_new_tokens=4, ignore_eos=True)
        made = [o async for o in front.generate([5, 6, 7], params)]
        await front.shutdown()
        return sum(len(o.new_token_ids) for o in made)

    assert asyncio.run(main()) == 4

    def broken() -> Engine:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        AsyncEngine(broken)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_the_step_thread_can_share_the_main_malloc_arena() -> None:
    assert one_malloc_arena()  # mallopt(M_ARENA_MAX, 1) accepted


def test_a_sink_takes_outputs_only_while_the_loop_is_idle_and_never_the_last(
    tiny_llama: Path,
) -> None:
    """Every output reaches the sink or the caller exactly once and in order, the last always
    the caller; none reaches the sink while one handed to the caller is still being handled
    (the caller dawdles over each, so the steps' outputs pile up behind it)."""
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    want = run_all(make_engine(tiny_llama), [[5, 6, 7]], params)[0]
    # as where compute takes every core: sinks are offered outputs
    front = AsyncEngine(make_engine(tiny_llama, speculate=3), yield_cores=True)
    busy = False  # the caller is handling an output
    tokens: list[int] = []  # in the order the sink and the caller got them
    offered = taken = 0

    def sink(out: RequestOutput) -> bool:
        nonlocal offered, taken
        assert not busy and not out.finished
        offered += 1
        if offered % 3 == 0:  # decline some: those go to the caller
            return False
        taken += 1
        tokens.extend(out.new_token_ids)
        return True

    async def main() -> list[RequestOutput]:
        nonlocal busy
        outs = []
        async for out in front.generate([5, 6, 7], params, sink=sink):
            busy = True
            await asyncio.sleep(0.02)
            tokens.extend(out.new_token_ids)
            outs.append(out)
            busy = False
        await front.shutdown()
        return outs

    outs = asyncio.run(main())
    assert tokens == want
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert taken >= 2 and offered > taken and len(outs) >= 2


def test_a_failing_sink_aborts_its_request_and_frees_its_blocks(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, num_blocks=256)
    front = AsyncEngine(engine, yield_cores=True)
    offered = 0

    def sink(out: RequestOutput) -> bool:
        nonlocal offered
        offered += 1
        if offered == 3:
            raise BrokenPipeError("the client went away")
        return True

    async def main() -> list[RequestOutput]:
        params = SamplingParams(max_new_tokens=400, ignore_eos=True)
        async with asyncio.timeout(30):
            outs = [o async for o in front.generate([5, 6, 7], params, sink=sink)]
        await front.shutdown()
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert offered == 3 and sum(len(o.new_token_ids) for o in outs) < 400
    assert engine.res.allocator.num_free == engine.res.allocator.num_blocks


def test_no_sink_is_offered_anything_while_a_core_is_spare(tiny_llama: Path) -> None:
    """With a core to spare the loop's work runs beside the compute: outputs go to it."""
    front = AsyncEngine(make_engine(tiny_llama), yield_cores=False)
    offered: list[RequestOutput] = []

    def sink(out: RequestOutput) -> bool:
        offered.append(out)
        return True

    async def main() -> int:
        params = SamplingParams(max_new_tokens=12, ignore_eos=True)
        n = sum([len(o.new_token_ids) async for o in front.generate([5, 6], params, sink=sink)])
        await front.shutdown()
        return n

    assert asyncio.run(main()) == 12 and not offered
