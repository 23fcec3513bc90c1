from __future__ import annotations

from pathlib import Path

from specserve.config import CacheConfig, EngineConfig, SchedulerConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.engine.request import SamplingParams


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
    **spec: object,
) -> Engine:
    return Engine(
        EngineConfig(
            model=str(model_dir) if model_dir else None,
            device=device,
            dense_weights=dense_weights,
            cache=CacheConfig(block_size=block_size, num_blocks=num_blocks),
            scheduler=SchedulerConfig(
                max_batch_tokens=max_batch_tokens, max_running_requests=max_running
            ),
            spec=SpecConfig(
                speculate=speculate,
                proposer=proposer,  # type: ignore[arg-type]
                draft_model=draft_model,
                **spec,  # type: ignore[arg-type]
            ),
        )
    )


def run_all(
    engine: Engine,
    prompts: list[list[int]] | list[str],
    params: SamplingParams | list[SamplingParams],
) -> list[list[int]]:
    """Submit everything at once, step to completion, return output tokens in prompt order.
    Fails if any request finished with an error (a failed pass would otherwise look like a
    short, "equal" output)."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    finished: dict[str, str | None] = {}
    while engine.has_work():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                finished[out.request_id] = out.finish_reason
    assert set(finished) == set(ids)
    errors = {i: r for i, r in finished.items() if r == "error"}
    assert not errors, f"requests finished with an error: {errors}"
    return [tokens[i] for i in ids]


def mixed_prompts(n: int, vocab: int = 320, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 40))] for _ in range(n)]
