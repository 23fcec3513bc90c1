"""FastAPI app factory: TGI and OpenAI routes, /info, /health, /metrics, errors, guard.

The app does not own the engine's lifetime: whoever serves it (see `server/cli.py`) drains the
HTTP connections first and then shuts the AsyncEngine down.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specserve import __version__
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.tokenizer import private_copy
from specserve.server import openai_api, responses_api, tgi, tokenize
from specserve.server.backend import LocalBackend
from specserve.server.context import Contexts, Ctx, OneContext, ServerContext
from specserve.server.errors import ApiError, ErrorKind, error_response, from_validation_errors
from specserve.server.info import info, reset_prefix_cache, reset_suffix_cache
from specserve.server.info_schemas import Info
from specserve.server.metrics import Coalesced, Labelled, ServerMetrics, snapshot
from specserve.server.middleware import GuardMiddleware
from specserve.server.outcome import Outcome
from specserve.server.provenance import Provenance
from specserve.server.responses_store import ResponseStore
from specserve.server.service import ClientGone, GenerationService
from specserve.server.settings import Limits, ServerSettings

logger = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499  # nginx's code: nobody is left to read the response


def create_app(
    async_engine: AsyncEngine, settings: ServerSettings, provenance: Provenance | None = None
) -> FastAPI:
    """`provenance`: the fingerprints and speculation profile checked at start-up, if any."""
    engine = async_engine.engine
    limits = async_engine.run_locked(lambda e: Limits.from_engine(e, settings))

    def read_engine() -> Labelled:
        return [({}, async_engine.read_between_steps(snapshot))]

    metrics = ServerMetrics(Coalesced(read_engine))
    backend = LocalBackend(async_engine, private_copy(engine.tokenizer))
    service = GenerationService(
        backend, metrics, settings.max_concurrent_requests, settings.retry_after_s
    )
    special = frozenset(int(i) for i in engine.tokenizer.all_special_ids)
    ctx = ServerContext(backend, settings, limits, metrics, service, special, provenance)
    app = api_app(OneContext(ctx), settings)
    app.state.ctx = ctx
    if provenance is not None and provenance.profile is not None:
        metrics.show_profile(provenance.profile.stale)
    metrics.show_block_fallback(engine.model.block_kernel_fallback is not None)
    app.add_api_route("/health", health, methods=["GET"], tags=["status"])
    app.add_api_route(
        "/health", health, methods=["HEAD"], tags=["status"], operation_id="health_head"
    )
    app.add_api_route("/info", info, methods=["GET"], response_model=Info, tags=["status"])
    app.add_api_route("/metrics", prometheus, methods=["GET"], tags=["status"])
    app.add_api_route("/reset_suffix_cache", reset_suffix_cache, methods=["POST"], tags=["admin"])
    app.add_api_route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"], tags=["admin"])
    return app


def api_app(contexts: Contexts, settings: ServerSettings) -> FastAPI:
    """The TGI and OpenAI routes, their error handlers and the guard (auth, body size): what
    `serve` and a fleet's ingress share. The caller adds /health, /info and /metrics."""
    app = FastAPI(
        title="specserve",
        version=__version__,
        description="TGI- and OpenAI-compatible LLM server with speculative decoding.",
    )
    app.state.contexts = contexts
    app.state.responses = ResponseStore()  # stored Responses, per tenant (server/responses_store)
    app.include_router(tgi.router)
    app.include_router(openai_api.router)
    app.include_router(responses_api.router)
    app.include_router(tokenize.router)
    _install_error_handlers(app, contexts)

    def on_reject(path: str, outcome: Outcome) -> None:  # 401, 413: before any body is parsed
        contexts.count(path, {}, outcome, None)

    app.add_middleware(
        GuardMiddleware,
        keys=settings.keys,
        admin_key=settings.admin_key,
        private_metrics=settings.private_metrics,
        max_body_bytes=settings.max_body_bytes,
        on_reject=on_reject,
    )
    return app


def _install_error_handlers(app: FastAPI, contexts: Contexts) -> None:
    def count(request: Request, outcome: Outcome) -> None:
        chosen = getattr(request.state, "chosen", None)
        contexts.count(request.url.path, dict(request.headers), outcome, chosen)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        if not exc.counted:
            count(request, exc.kind.outcome)
        return error_response(request.url.path, exc)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        count(request, Outcome.INVALID)
        err = from_validation_errors(exc.errors(), required_fields(request))
        return error_response(request.url.path, err)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)  # unknown route, wrong method
        kind = ErrorKind.NOT_FOUND if exc.status_code == 404 else ErrorKind.VALIDATION
        count(request, kind.outcome)
        err = ApiError(exc.status_code, str(exc.detail), kind, None, dict(exc.headers or {}))
        return error_response(request.url.path, err)

    async def on_gone(request: Request, exc: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    async def on_crash(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this answer, so the traceback is logged once, by uvicorn.
        count(request, Outcome.ERROR)
        err = ApiError(500, f"internal error: {type(exc).__name__}: {exc}", ErrorKind.GENERATION)
        return error_response(request.url.path, err)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(ClientGone, on_gone)
    app.add_exception_handler(Exception, on_crash)


def required_fields(request: Request) -> list[str]:
    """The required fields of the route's JSON body, to name when the body is missing."""
    body = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(body, "field_info", None), "annotation", None)
    fields = getattr(model, "model_fields", {})
    return [name for name, f in fields.items() if f.is_required()]


async def health(ctx: Ctx) -> JSONResponse:
    """200 while serving; 503 once shutdown has begun or if the engine thread has died (stop
    routing requests here)."""
    backend = ctx.backend
    if not backend.alive:
        body = {"status": "engine_failed", "error": backend.died or "the engine stopped"}
        return JSONResponse(body, status_code=503)
    if ctx.service.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def prometheus(ctx: Ctx) -> Response:
    """Prometheus exposition (text format 0.0.4)."""
    body = await asyncio.to_thread(ctx.metrics.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
