"""Load generator: streams requests at a running server and times every token on the client.

Completion items (`prompt`) go to TGI's `POST /generate_stream` (one event per token, the last
with `details`); chat items (`messages`) go to `POST /v1/chat/completions` with `stream: true`
and `stream_options.include_usage` (one chunk per engine step, then `usage`). Both carry the
per-request `speculate` cap, so one server started with N serves every N' <= N.

Two ways to offer load, per cell:

- closed loop: `concurrency` workers, each sending its next request when the last one ends;
- open loop: Poisson arrivals at `rate` requests/s (exponential gaps, seeded), however many
  are in flight.

Either stops after `num_requests` sends or once `duration_s` has passed, then waits for the
requests in flight. A conversation (items chained by `follows`) is one send: its turns go one
after another, each carrying the reply the previous one actually got. Times are
`time.perf_counter()` seconds relative to the cell's start.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from specserve.bench.records import CellKey, RequestRecord
from specserve.bench.structured_workloads import check_reply
from specserve.bench.workload_items import (
    ChatMessage,
    WorkloadItem,
    conversations,
    next_history,
    with_history,
)


@dataclass(frozen=True)
class GenSettings:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0  # request i of a cell samples with seed + i, so every N sees the same draws
    ignore_eos: bool = False
    timeout_s: float = 600.0
    # Send the per-request `speculate` cap. Off: the server's (or fleet pool's) own N applies.
    per_request_cap: bool = True


@dataclass(frozen=True)
class Budget:
    """When a cell stops sending: after `num_requests` or after `duration_s` (first reached)."""

    num_requests: int | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s")

    def allows(self, sent: int, elapsed: float) -> bool:
        over_count = self.num_requests is not None and sent >= self.num_requests
        return not over_count and (self.duration_s is None or elapsed < self.duration_s)


def request_for(
    item: WorkloadItem, speculate: int, s: GenSettings, index: int
) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) for one item; request `index` of a cell samples with seed + index."""
    seed = s.seed + index
    if item.messages is None:
        params: dict[str, Any] = {
            "max_new_tokens": s.max_new_tokens,
            "details": True,
            "speculate": speculate,
            "ignore_eos": s.ignore_eos,
        }
        if s.temperature > 0:
            params.update(do_sample=True, temperature=s.temperature, seed=seed)
        return "/generate_stream", {"inputs": item.prompt, "parameters": params}
    body = {
        "messages": [vars(m) for m in item.messages],
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "speculate": speculate,
        "ignore_eos": s.ignore_eos and item.structured is None,  # refused with a grammar
        **item.request_fields(),
    }
    return "/v1/chat/completions", body


async def send(
    client: httpx.AsyncClient,
    item: WorkloadItem,
    speculate: int,
    s: GenSettings,
    index: int,
    t0: float,
    keep_reply: bool = False,
) -> RequestRecord:
    path, body = request_for(item, speculate, s, index)
    if not s.per_request_cap:
        body.get("parameters", body).pop("speculate", None)
    sent = time.perf_counter()
    rec = RequestRecord(item.id, "chat" if item.messages else "generate_stream", sent - t0)
    rec.reply = "" if keep_reply or item.structured else None
    token_times: list[float] = []
    try:
        async with client.stream("POST", path, json=body, timeout=s.timeout_s) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                rec.error = (await resp.aread()).decode(errors="replace")[:500]
                return rec
            parse = _tgi_event if rec.route == "generate_stream" else _chat_event
            async for event in _sse(resp):
                if "error" in event:
                    rec.error = json.dumps(event["error"])[:500]
                    return rec
                if parse(event, rec):
                    token_times.append(time.perf_counter())
            rec.ok = rec.finish_reason is not None
            rec.error = None if rec.ok else "stream ended without a final event"
            if rec.ok and item.structured is not None:
                rec.error = check_reply(item, rec.reply or "", rec.tool_calls, rec.finish_reason)
                rec.ok = rec.error is None
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        end = time.perf_counter()
        rec.e2e = end - sent
        if token_times:
            rec.ttft = token_times[0] - sent
            rec.decode_s = token_times[-1] - token_times[0]
            rec.gaps = [round(b - a, 6) for a, b in itertools.pairwise(token_times)]
    return rec


async def _sse(resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        event = json.loads(data)
        if isinstance(event, dict):
            yield event


def _tgi_event(event: dict[str, Any], rec: RequestRecord) -> bool:
    """Every TGI event carries one token; the last one carries `details` too."""
    rec.output_tokens += 1
    details = event.get("details")
    if details:
        rec.output_tokens = int(details.get("generated_tokens", rec.output_tokens))
        rec.finish_reason = str(details.get("finish_reason"))
        rec.drafted = details.get("drafted_tokens")
        rec.accepted = details.get("accepted_tokens")
        rec.spec_steps = details.get("speculation_steps")
    elif event.get("generated_text") is not None:
        rec.finish_reason = "unknown"
    return "token" in event


def _chat_event(event: dict[str, Any], rec: RequestRecord) -> bool:
    """A chunk carries a content delta (one engine step), a finish reason, or the usage."""
    usage = event.get("usage")
    if usage:
        rec.output_tokens = int(usage.get("completion_tokens", 0))
        extra = usage.get("completion_tokens_details") or {}
        acc, rej = extra.get("accepted_prediction_tokens"), extra.get("rejected_prediction_tokens")
        if acc is not None and rej is not None:
            rec.drafted, rec.accepted = acc + rej, acc
        rec.spec_steps = extra.get("speculation_steps")
    has_text = False
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        content, calls = delta.get("content"), delta.get("tool_calls")
        has_text |= bool(content or calls)
        if content and rec.reply is not None:
            rec.reply += content
        for call in calls or ():
            merge_call(rec.tool_calls, call)
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]
    return has_text


def merge_call(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    """A streamed tool-call delta into the calls so far, by its index: OpenAI streams a call's
    id and name first, then its arguments in pieces."""
    i = delta.get("index", len(calls))
    function = delta.get("function") or {}
    if i >= len(calls):
        head = {"id": delta.get("id"), "type": delta.get("type", "function")}
        calls.append({**head, "function": {"name": function.get("name"), "arguments": ""}})
    calls[i]["function"]["arguments"] += function.get("arguments") or ""


OnDone = Callable[[RequestRecord], None]


async def run_cell(
    client: httpx.AsyncClient,
    items: list[WorkloadItem],
    key: CellKey,
    budget: Budget,
    s: GenSettings,
    on_done: OnDone | None = None,
) -> tuple[list[RequestRecord], float]:
    """Offer one cell's load; (records in send order, seconds from start to last finish)."""
    t0 = time.perf_counter()
    records: dict[tuple[int, int], RequestRecord] = {}
    units = conversations(items)

    async def one(i: int) -> None:
        unit = units[i % len(units)]
        history: tuple[ChatMessage, ...] = ()
        for turn, item in enumerate(unit):
            sent = with_history(item, history)
            last = turn == len(unit) - 1
            rec = await send(client, sent, key.speculate, s, i, t0, keep_reply=not last)
            records[i, turn] = rec
            if on_done is not None:
                on_done(rec)
            if not rec.ok or rec.reply is None:
                return
            history = next_history(sent, rec.reply)

    if key.mode == "closed":
        await _closed(one, int(key.load), budget, t0)
    else:
        await _open(one, key.load, budget, t0, random.Random(s.seed))
    return [records[key] for key in sorted(records)], time.perf_counter() - t0


async def _closed(one: Callable[[int], Any], concurrency: int, budget: Budget, t0: float) -> None:
    counter = iter(range(1 << 62))

    async def worker() -> None:
        while budget.allows(i := next(counter), time.perf_counter() - t0):
            await one(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _open(
    one: Callable[[int], Any], rate: float, budget: Budget, t0: float, rng: random.Random
) -> None:
    tasks, due, i = [], 0.0, 0
    while budget.allows(i, due):
        await asyncio.sleep(max(0.0, due - (time.perf_counter() - t0)))
        tasks.append(asyncio.ensure_future(one(i)))
        i, due = i + 1, due + rng.expovariate(rate)
    await asyncio.gather(*tasks)
