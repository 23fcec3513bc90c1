"""A request's way in: its prompt encoded and checked against the engine's limits, before any
engine state is touched (so any thread may call it)."""

from __future__ import annotations

import random
from dataclasses import replace

from specserve.engine.prompt import encode_text
from specserve.engine.resources import EngineResources
from specserve.grammar import Grammars
from specserve.request import SamplingParams, check_request


def prepare_request(
    res: EngineResources, grammars: Grammars, prompt: str | list[int], params: SamplingParams
) -> tuple[list[int], SamplingParams]:
    """Token ids and the parameters to run; ValueError naming the limit on bad input. A
    sampled request without a seed gets a random one here, so it can be reported."""
    ids = encode_text(res.tokenizer, prompt) if isinstance(prompt, str) else list(prompt)
    alloc = res.allocator
    check_request(
        ids,
        params,
        vocab_size=res.model.arch.vocab_size,
        max_model_len=res.max_model_len,
        kv_capacity=alloc.num_blocks * alloc.block_size,
    )
    if params.grammar is not None:
        grammars.compile(params.grammar)  # ValueError: invalid or over the limits
    if not params.greedy and params.seed is None:
        params = replace(params, seed=random.getrandbits(63))
    return ids, params
