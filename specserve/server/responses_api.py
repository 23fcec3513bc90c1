"""The OpenAI Responses API: POST /v1/responses (streaming or not), GET and DELETE
/v1/responses/{id}.

A Responses request is turned into the chat completions request it means
(server/responses_input.py) and prepared, admitted and run exactly as /v1/chat/completions is;
only the reply's shape differs (server/responses_output.py, responses_stream.py). Stored
responses (server/responses_store.py) are kept per tenant: another API key's id is not found.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from specserve.outputs import RequestOutput
from specserve.server.admission import prepared
from specserve.server.context import Ctx
from specserve.server.errors import ApiError, ErrorKind
from specserve.server.openai_api import chat_encoder
from specserve.server.openai_schemas import ChatCompletionRequest
from specserve.server.openai_stream import stream
from specserve.server.params import Preparation, Prepared, prepare, tenant_of
from specserve.server.responses_input import chat_request, input_messages, responses_fields
from specserve.server.responses_output import Turn, item_id, remember
from specserve.server.responses_schemas import DeletedResponse, ResponseObject, ResponsesRequest
from specserve.server.responses_store import ResponseStore, Stored
from specserve.server.responses_stream import ResponseEvents
from specserve.server.sse import EventStream

router = APIRouter(prefix="/v1", tags=["OpenAI"])

_ERROR = {"description": "OpenAI error object: {error: {message, type, param, code}}"}
_CREATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}},
    **{code: _ERROR for code in (400, 401, 404, 413, 429, 500, 503)},
}


def get_store(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.responses
    return store


Store = Annotated[ResponseStore, Depends(get_store)]


@router.post("/responses", response_model=ResponseObject, responses=_CREATE_RESPONSES)
async def create_response(
    body: ResponsesRequest, request: Request, ctx: Ctx, store: Store
) -> ResponseObject | EventStream:
    tracked = ctx.service.admit("/v1/responses")
    tenant = tenant_of(request)
    rid, created = item_id("resp"), int(time.time())

    def prepare_turn() -> tuple[Turn, ChatCompletionRequest, Prepared]:
        with responses_fields():
            history = previous(store, tenant, body.previous_response_id)
            conversation = [*history, *input_messages(body.input)]
            chat = chat_request(body, conversation)
            prep = prepare(chat, Preparation(ctx.limits, ctx.encode, chat_encoder(ctx), tenant))
        turn = Turn(rid, created, ctx.settings.model_id, body, prep.tools, conversation, tenant)
        return turn, chat, prep

    turn, chat, prep = await prepared(ctx.service, tracked, prepare_turn)
    if body.stream:
        events = ResponseEvents(turn, partial(remember, store, turn))
        return stream(ctx, request, chat, prep, tracked, rid, events, _unused, events.first())
    result = (await ctx.service.collect_choices(request, tracked, prep, rid, 1))[0]
    response = turn.finished(result.text, result.final)
    remember(store, turn, response)
    return response


@router.get("/responses/{response_id}", response_model=ResponseObject, responses={404: _ERROR})
async def get_response(response_id: str, request: Request, store: Store) -> ResponseObject:
    return stored(store, tenant_of(request), response_id, "response_id").response


@router.delete("/responses/{response_id}", response_model=DeletedResponse, responses={404: _ERROR})
async def delete_response(response_id: str, request: Request, store: Store) -> DeletedResponse:
    if not store.delete(tenant_of(request), response_id):
        raise not_found(response_id, "response_id")
    return DeletedResponse(id=response_id)


def previous(store: ResponseStore, tenant: str | None, response_id: str | None) -> list[Any]:
    """The conversation of the response `previous_response_id` names (none without one)."""
    if response_id is None:
        return []
    return stored(store, tenant, response_id, "previous_response_id").messages


def stored(store: ResponseStore, tenant: str | None, response_id: str, field: str) -> Stored:
    found = store.get(tenant, response_id)
    if found is None:
        raise not_found(response_id, field)
    return found


def not_found(response_id: str, field: str) -> ApiError:
    return ApiError(
        404,
        f"{field}: no stored response {response_id!r} for this API key (responses are kept "
        "in memory with store: true, the least recently used going first)",
        ErrorKind.NOT_FOUND,
        field,
    )


def _unused(finals: list[RequestOutput]) -> None:
    """The chat stream's usage chunk: a Responses stream sends usage in its last event."""
