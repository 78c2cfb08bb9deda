"""Retrying calls to the Tinker service: which failures are transient, and the backoff (tenacity).

The SDK retries connection errors itself; what reaches us is what its own retries gave up on, or a request the
service failed (`RequestFailedError` of category Server / Unknown, a 408/429/5xx status). Those are retried
here with exponential backoff; a failure caused by the request itself (category User, a 4xx) is not. Once the
tries are spent, the call raises TrainingError naming the call and the service's message.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tenacity import AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from rllm_core.errors import TrainingError

__all__ = ["RETRY_ATTEMPTS", "acall_with_retries", "call_with_retries", "is_transient", "service_error"]

T = TypeVar("T")

RETRY_ATTEMPTS = int(os.environ.get("RLLM_TINKER_RETRIES", "4"))
"""Tries per service call (the first included)."""
RETRY_WAIT_S = float(os.environ.get("RLLM_TINKER_RETRY_WAIT_S", "2"))
"""First backoff; it doubles per try, up to 60 s."""


def is_transient(exc: BaseException) -> bool:
    """True for failures worth another try: connection/timeouts, 408/429/5xx, server-side request failures."""
    try:
        import tinker
    except ImportError:
        return False
    if isinstance(exc, tinker.APIConnectionError | TimeoutError):
        return True
    if isinstance(exc, tinker.APIStatusError):
        code = exc.status_code
        return code in (408, 429) or 500 <= code < 600  # not 409: a name clash stays one
    if isinstance(exc, tinker.RequestFailedError):
        return str(exc.category).lower() != "user"
    return False


def service_error(exc: BaseException) -> str:
    """The service's own message, without the SDK's class path."""
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}"


def _retrying_kwargs(attempts: int | None) -> dict[str, Any]:
    return {"stop": stop_after_attempt(attempts or RETRY_ATTEMPTS),
            "wait": wait_exponential(multiplier=RETRY_WAIT_S, max=60),
            "retry": retry_if_exception(is_transient), "reraise": True}


def call_with_retries(fn: Callable[[], T], *, what: str, attempts: int | None = None) -> T:
    """`fn()`, retried on transient failures; TrainingError naming `what` when it still fails."""
    try:
        for attempt in Retrying(**_retrying_kwargs(attempts)):
            with attempt:
                return fn()
    except TrainingError:
        raise
    except Exception as exc:
        raise _failed(what, exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover - tenacity either returns or raises


async def acall_with_retries(fn: Callable[[], Awaitable[T]], *, what: str, attempts: int | None = None) -> T:
    """`await fn()`, retried on transient failures; TrainingError naming `what` when it still fails."""
    try:
        async for attempt in AsyncRetrying(**_retrying_kwargs(attempts)):
            with attempt:
                return await fn()
    except TrainingError:
        raise
    except Exception as exc:
        raise _failed(what, exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _failed(what: str, exc: BaseException) -> TrainingError:
    tried = f" after {RETRY_ATTEMPTS} tries" if is_transient(exc) else ""
    return TrainingError(f"the Tinker service failed {what}{tried}: {type(exc).__name__}: {exc}")
