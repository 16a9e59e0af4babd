"""The one retry helper of every client: what may be retried, backoff with jitter, attempt and time bounds, redirects.

A call is sent again only when sending it again is safe and may help:

- UNAVAILABLE or DEADLINE_EXCEEDED, for a method the proto marks IDEMPOTENT or NO_SIDE_EFFECTS;
- UNAVAILABLE with ``ff-not-primary`` from a standby (the call did not run, whatever the method), when the
  caller routes (a ``Router``, e.g. to the mgmtd primary): the next attempt goes where the answer points;
- UNAVAILABLE, whatever the method, for a call that never reached a server (no connection could be made, or the
  server refused the stream before reading it), for a service of several interchangeable instances (meta's:
  ``unavailable_did_not_run``). Any other UNAVAILABLE of a non-idempotent call is raised: gRPC answers it too when
  a connection is lost after the server ran the call ("Stream removed", "Socket closed"), and sending it again would
  apply it twice.

Everything else (INVALID_ARGUMENT, PERMISSION_DENIED, NOT_FOUND, ...) is raised at once. A retried call gives up
after ``max_attempts`` or once the next wait would pass ``max_total_s``, raising the last error as
``RetriesExhausted`` (an ``RpcError`` with the same code, details and trailing metadata).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc

from ff_rpc.errors import RpcError

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
PRIMARY_ADDRESS_METADATA = "ff-primary-address"
NOT_PRIMARY_METADATA = "ff-not-primary"


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by attempts and, optionally, by total time.

    Attributes:
        max_attempts: calls in all, the first included (1: never retried).
        initial_backoff_s: the ceiling of the first wait.
        max_backoff_s: the largest ceiling of a wait.
        multiplier: how much the ceiling grows per retry.
        max_total_s: no retry whose wait would end later than this after the first call started (None: no bound).
    """

    max_attempts: int = 4
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    multiplier: float = 2.0
    max_total_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not 0 <= self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                f"need 0 <= initial_backoff_s <= max_backoff_s, got {self.initial_backoff_s}, {self.max_backoff_s}"
            )

    def backoff_s(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Sleep before retry number ``attempt`` (1-based): uniform in [0, min(max, initial*mult^(n-1))]."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        return cap * rand()


NO_RETRY = RetryPolicy(max_attempts=1)


class RetriesExhausted(RpcError):
    """The last error of a call that could have been retried but ran out of attempts or time."""

    def __init__(self, last: RpcError, num_attempts: int) -> None:
        super().__init__(last.code, last.details, last.trailing_metadata)
        self.num_attempts = num_attempts


class Router(Protocol):
    """Where a routed call goes next (the mgmtd primary, ...): it moves on after a failed attempt."""

    async def follow(self, err: RpcError) -> bool:
        """Move on after ``err`` (UNAVAILABLE or DEADLINE_EXCEEDED): True to send the next attempt without a backoff.

        True when redirected to a named primary or to another instance that has not failed yet.
        """
        ...


def is_not_primary(err: RpcError) -> bool:
    """A standby's refusal: the call did not run, and the primary may be named in ``ff-primary-address``."""
    return err.code is grpc.StatusCode.UNAVAILABLE and NOT_PRIMARY_METADATA in err.trailing_metadata


# How gRPC words an UNAVAILABLE for a call that never reached a server: no connection could be made, or the server
# refused the stream before reading it (HTTP/2 REFUSED_STREAM, error code 7).
_NEVER_SENT_DETAILS = ("failed to connect to all addresses", "dns resolution failed", "rst_stream with error code 7")


def never_reached_a_server(err: RpcError) -> bool:
    """An UNAVAILABLE for a call no server ran (see ``_NEVER_SENT_DETAILS``); sending it again is safe."""
    details = (err.details or "").lower()
    return err.code is grpc.StatusCode.UNAVAILABLE and any(d in details for d in _NEVER_SENT_DETAILS)


def should_retry(err: RpcError, *, idempotent: bool, routed: bool, unavailable_did_not_run: bool = False) -> bool:
    """Whether sending the call again is safe and may help (see the module)."""
    if routed and is_not_primary(err):
        return True
    if unavailable_did_not_run and never_reached_a_server(err):
        return True
    return err.code in RETRYABLE_CODES and idempotent


async def retry_call(
    attempt: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    idempotent: bool,
    router: Router | None = None,
    unavailable_did_not_run: bool = False,
    name: str = "",
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Runs ``attempt`` until it succeeds or may not be retried (see the module).

    With a ``router``, an UNAVAILABLE or DEADLINE_EXCEEDED attempt moves it on even when the call is not retried
    (so the next call does not start from an address that did not answer); an attempt redirected to a named
    primary is sent again at once, others after the policy's backoff.

    Raises:
        RetriesExhausted: the last attempt's error, when the bounds stopped the retries.
        RpcError: an error that is not retried.
    """
    started = clock()
    number = 1
    while True:
        try:
            return await attempt()
        except RpcError as err:
            redirected = await router.follow(err) if router is not None and err.code in RETRYABLE_CODES else False
            routed = router is not None
            if not should_retry(
                err, idempotent=idempotent, routed=routed, unavailable_did_not_run=unavailable_did_not_run
            ):
                raise
            if number >= policy.max_attempts:
                raise RetriesExhausted(err, number) from None
            delay_s = 0.0 if redirected else policy.backoff_s(number)
            if policy.max_total_s is not None and clock() - started + delay_s > policy.max_total_s:
                raise RetriesExhausted(err, number) from None
            logger.debug("retrying %s after %s (%.3fs)", name, err.code.name, delay_s)
            number += 1
            if delay_s > 0:
                await sleep(delay_s)
