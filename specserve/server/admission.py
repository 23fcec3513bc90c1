"""Work on an admitted request before the engine sees it, off the event loop.

The routes admit first (`GenerationService.admit`: 429 before any work), then check and tokenise
the body in a worker thread (`prepared`), with the backend's own prompt tokenizer: a 2 MB prompt
stalls neither the loop nor the engine's detokenizer, and one refused at 429 is never tokenised.
However the preparation ends short of a result, the request's slot is freed and the request
counted once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from specserve.server.errors import ApiError, ErrorKind
from specserve.server.outcome import Outcome
from specserve.server.service import GenerationService
from specserve.server.tracked import Tracked

logger = logging.getLogger(__name__)
T = TypeVar("T")


async def prepared(service: GenerationService, tracked: Tracked, prepare: Callable[[], T]) -> T:
    """`prepare()` run in a worker thread for an admitted request."""
    try:
        return await asyncio.to_thread(prepare)
    except ApiError as err:
        tracked.outcome = err.kind.outcome
        err.counted = True
        service.close(tracked)
        raise
    except Exception as exc:
        logger.exception("preparing a request for %s failed", tracked.route)
        tracked.outcome = Outcome.ERROR
        service.close(tracked)
        message = f"internal error: {type(exc).__name__}: {exc}"
        raise ApiError(500, message, ErrorKind.GENERATION, counted=True) from exc
    except BaseException:  # cancelled: the client went away
        service.close(tracked)
        raise
