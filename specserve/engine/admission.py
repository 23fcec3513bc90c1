"""A request's way in: its prompt encoded and checked against the engine's limits, before any
engine state is touched (so any thread may call it); then its sequence and live state."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from specserve.engine.detokenizer import IncrementalDetokenizer
from specserve.engine.live import Live
from specserve.engine.prompt import encode_text
from specserve.engine.resources import EngineResources
from specserve.grammar import Grammars
from specserve.request import SamplingParams, Sequence, check_request


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
    if params.grammar is not None:  # ValueError: invalid or over the limits
        params = replace(params, grammar=grammars.compile(params.grammar))  # compiled, carried
    if not params.greedy and params.seed is None:
        params = replace(params, seed=random.getrandbits(63))
    return ids, params


def new_live(
    seq_id: int,
    request_id: str,
    ids: list[int],
    params: SamplingParams,
    grammars: Grammars,
    tokenizer: Any,
) -> Live:
    """A prepared request's sequence and live state; its grammar's constraint (if any) is its
    first logits processor, a copy of the grammar `prepare_request` compiled."""
    seq = Sequence(seq_id=seq_id, request_id=request_id, prompt_ids=ids, params=params)
    if params.grammar is not None:
        seq.logits_processors = (grammars.processor(params.grammar, len(ids)),)
    return Live(seq, IncrementalDetokenizer(tokenizer, params.stop))
