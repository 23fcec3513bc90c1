"""ASGI guard in front of every route: bearer-token auth, the body size limit, UTF-8 bodies.

The body is read here, up to the limit, before the app sees it: a declared Content-Length over
the limit is refused without reading, and a chunked body is refused as soon as it crosses the
limit; a body that is not UTF-8 is refused (400, in the route family's error shape). The app
then receives the buffered body, and later `receive()` calls (disconnect watching) go straight
to the server.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specserve.server.errors import ApiError, ErrorKind, error_response, not_utf8
from specserve.server.outcome import Outcome

# Probes and scrapers run without credentials.
PUBLIC_PATHS = frozenset({"/health", "/metrics"})
# The operator's routes: they show or empty what every tenant's requests left behind.
ADMIN_PATHS = frozenset({"/info", "/reset_prefix_cache", "/reset_suffix_cache"})
OnReject = Callable[[str, Outcome], None]  # (path, outcome)


def matching_key(header: str | None, keys: tuple[str, ...]) -> int | None:
    """Which of `keys` an `Authorization: Bearer <key>` header holds, if any. Every key is
    compared in constant time, whichever matched."""
    scheme, _, token = (header or "").partition(" ")
    given = token.strip().encode()
    found = None
    for i, key in enumerate(keys):
        if hmac.compare_digest(given, key.encode()):
            found = i
    return found if scheme.lower() == "bearer" else None


def tenant_id(key: str) -> str:
    """The name of a key's tenant where it is recorded (a request's cache salt): a digest, so
    that the key itself is in no request record or log."""
    return "tenant-" + hashlib.sha256(b"specserve tenant\0" + key.encode()).hexdigest()[:16]


class GuardMiddleware:
    """With more than one key, each is a tenant: the request's scope state gets `tenant`, the
    key's `tenant_id`, and its requests are isolated from other tenants' (see
    `params.salted`). `ADMIN_PATHS` take the admin key where one is given; without one,
    any accepted key where there is one key (or none), and no key where there are tenants."""

    def __init__(
        self,
        app: ASGIApp,
        keys: tuple[str, ...],
        max_body_bytes: int,
        on_reject: OnReject,
        private_metrics: bool = False,
        admin_key: str | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        # The key checked against: the API keys, then the admin key (accepted everywhere).
        self.accepted = keys + ((admin_key,) if admin_key is not None else ())
        self.admin = len(keys) if admin_key is not None else None  # its index in `accepted`
        self.anyone_admin = admin_key is None and len(keys) <= 1
        self.public = PUBLIC_PATHS - {"/metrics"} if private_metrics else PUBLIC_PATHS
        tenants = [tenant_id(k) for k in self.accepted] if len(keys) > 1 else None
        self.tenants = tenants
        self.max_body_bytes = max_body_bytes
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        checks = bool(self.accepted) and path not in self.public
        key = matching_key(headers.get("authorization"), self.accepted) if checks else None
        if self.keys and checks and key is None:
            err = ApiError(
                401,
                "missing or invalid API key (Authorization: Bearer <key>)",
                ErrorKind.UNAUTHORIZED,
                None,
                {"WWW-Authenticate": "Bearer"},
            )
            await self._reject(scope, receive, send, err)
            return
        admin = self.anyone_admin or (self.admin is not None and key == self.admin)
        if path in ADMIN_PATHS and not admin:
            err = ApiError(
                403,
                f"{path} needs the admin key (--admin-key-file): it shows or empties every "
                "tenant's caches",
                ErrorKind.FORBIDDEN,
            )
            await self._reject(scope, receive, send, err)
            return
        if self.tenants is not None and key is not None:
            scope.setdefault("state", {})["tenant"] = self.tenants[key]
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._reject(scope, receive, send, self._too_large())
            return
        body = await self._read_body(receive)
        if body is None:
            await self._reject(scope, receive, send, self._too_large())
            return
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            await self._reject(scope, receive, send, not_utf8(exc))
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"request body is larger than {self.max_body_bytes} bytes (--max-body-bytes)",
            ErrorKind.TOO_LARGE,
        )

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it passes the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)  # disconnected: the app will notice
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, err: ApiError) -> None:
        self.on_reject(scope["path"], err.kind.outcome)
        await error_response(scope["path"], err)(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
