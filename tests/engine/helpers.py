from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specserve.config import CacheConfig, EngineConfig, Numerics, SchedulerConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.request import SamplingParams
from specserve.runner.cost import LiveCost


def make_engine(
    model_dir: Path | None,
    num_blocks: int | None = 64,
    block_size: int = 4,
    max_batch_tokens: int = 256,
    max_running: int = 16,
    speculate: int = 0,
    proposer: str = "auto",
    draft_model: str | None = None,
    device: str = "cpu",
    dense_weights: bool = False,
    prefix_caching: bool = True,
    numerics: Numerics = "q8",
    kv_dtype: str = "float16",
    window_pool: bool = True,
    itl_target_ms: float = 0.0,
    policy: str = "static",
    eos_ids: frozenset[int] | None = None,
    step_cost: LiveCost | None = None,
    **spec: object,
) -> Engine:
    """An engine on `model_dir`. No ITL target unless asked: its chunks follow measured step
    times, and tests that count steps must not depend on a clock (test_stall_free injects a
    cost). Static drafts unless asked (the server's default is adaptive): what the adaptive
    policy verifies follows measured step times, and a busy machine can price every draft out,
    which would leave a test's "drafted and had drafts rejected" to chance; the adaptive
    policy's own tests ask for it. `eos_ids`: the tokens that end a request, if not the
    model's."""
    return Engine(
        EngineConfig(
            model=str(model_dir) if model_dir else None,
            device=device,
            dense_weights=dense_weights,
            numerics=numerics,
            cache=CacheConfig(
                block_size=block_size,
                num_blocks=num_blocks,
                prefix_caching=prefix_caching,
                kv_dtype=kv_dtype,  # type: ignore[arg-type]
                window_pool=window_pool,
            ),
            scheduler=SchedulerConfig(
                max_batch_tokens=max_batch_tokens,
                max_running_requests=max_running,
                itl_target_ms=itl_target_ms,
            ),
            spec=SpecConfig(
                speculate=speculate,
                proposer=proposer,
                policy=policy,  # type: ignore[arg-type]
                draft_model=draft_model,
                **spec,  # type: ignore[arg-type]
            ),
        ),
        eos_ids=eos_ids,
        step_cost=step_cost,
    )


@dataclass
class Outcome:
    """One request's whole output, as `collect` saw it."""

    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None


def collect(
    engine: Engine,
    prompts: Sequence[list[int] | str],
    params: SamplingParams | list[SamplingParams],
) -> list[Outcome]:
    """Submit everything at once, step to completion; one Outcome per prompt, in order."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
    outcomes = {i: Outcome() for i in ids}
    while engine.has_work():
        for out in engine.step():
            o = outcomes[out.request_id]
            assert o.finish_reason is None, f"{out.request_id} got output after finishing"
            o.tokens += out.new_token_ids
            if out.finished:
                o.finish_reason, o.error = out.finish_reason, out.error
    assert all(o.finish_reason is not None for o in outcomes.values())
    return [outcomes[i] for i in ids]


def run_all(
    engine: Engine,
    prompts: list[list[int]] | list[str],
    params: SamplingParams | list[SamplingParams],
) -> list[list[int]]:
    """Output tokens in prompt order; fails if any request errored or was aborted (an on/off
    equality must never pass on two failed runs)."""
    outcomes = collect(engine, prompts, params)
    failed = [(o.finish_reason, o.error) for o in outcomes if o.finish_reason in FAILED]
    assert not failed, f"requests failed: {failed}"
    return [o.tokens for o in outcomes]


FAILED = ("error", "abort")


def assert_no_kv_held(engine: Engine) -> None:
    """Every KV block is back on its free list: the target's and, with a draft model, the
    draft's; and nothing is left to run."""
    from specserve.speculation.draft import DraftModelProposer

    alloc = engine.res.allocator
    assert alloc.num_free == alloc.num_blocks, f"target holds {alloc.num_used} blocks"
    window = engine.res.window
    assert window is None or window.num_used == 0, f"window pool holds {window.num_used}"
    proposer = engine.res.proposer
    if isinstance(proposer, DraftModelProposer):
        held = proposer.num_blocks - proposer.num_free_blocks
        assert held == 0, f"draft holds {held} blocks"
    assert not engine.has_work()


def mixed_prompts(n: int, vocab: int = 320, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 40))] for _ in range(n)]
