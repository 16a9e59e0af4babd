"""ff_rpc.retry: what is retried, bounds, backoff, and redirects to a named primary (no sockets, no sleeps)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
import pytest

from ff_rpc import RetryPolicy, RpcError
from ff_rpc.retry import NOT_PRIMARY_METADATA, PRIMARY_ADDRESS_METADATA, RetriesExhausted, retry_call

C = grpc.StatusCode
POLICY = RetryPolicy(max_attempts=4, initial_backoff_s=0.1, max_backoff_s=1.0)


class Script:
    """An attempt that answers from a list: an RpcError is raised, anything else returned; it records its calls."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self) -> object:
        answer = self.answers[self.calls]
        self.calls += 1
        if isinstance(answer, RpcError):
            raise answer
        return answer


class Sleeps:
    """Records the waits instead of sleeping, and moves a fake clock by them."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.now = 0.0

    async def __call__(self, delay_s: float) -> None:
        self.waits.append(delay_s)
        self.now += delay_s

    def clock(self) -> float:
        return self.now


class Addresses:
    """A router over a list of addresses, like MgmtdClient's: a named primary first, else the next one."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.current = addresses[0]

    async def follow(self, err: RpcError) -> bool:
        primary = err.trailing_metadata.get(PRIMARY_ADDRESS_METADATA, "")
        if primary and primary != self.current:
            self.current = primary
            return True
        self.current = self.addresses[(self.addresses.index(self.current) + 1) % len(self.addresses)]
        return False


async def run(
    attempt: Callable[[], Awaitable[object]], *, policy: RetryPolicy = POLICY, idempotent: bool = True, **kw: object
) -> tuple[object, Sleeps]:
    sleeps = Sleeps()
    result = await retry_call(attempt, policy=policy, idempotent=idempotent, sleep=sleeps, clock=sleeps.clock, **kw)  # type: ignore[arg-type]
    return result, sleeps


async def test_unavailable_then_success_retries_after_a_jittered_backoff() -> None:
    attempt = Script(RpcError(C.UNAVAILABLE, "down"), RpcError(C.UNAVAILABLE, "down"), "answer")
    result, sleeps = await run(attempt)
    assert result == "answer"
    assert attempt.calls == 3
    assert len(sleeps.waits) == 2
    assert 0 <= sleeps.waits[0] <= 0.1
    assert 0 <= sleeps.waits[1] <= 0.2


async def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    errors = [RpcError(C.UNAVAILABLE, f"down {n}") for n in range(5)]
    attempt = Script(*errors)
    with pytest.raises(RetriesExhausted) as err:
        await run(attempt)
    assert (err.value.code, err.value.details, err.value.num_attempts) == (C.UNAVAILABLE, "down 3", 4)
    assert attempt.calls == 4


async def test_gives_up_when_the_next_wait_would_pass_the_total_time_with_the_last_error() -> None:
    sleeps = Sleeps()
    errors = [RpcError(C.DEADLINE_EXCEEDED, f"slow {n}") for n in range(10)]
    calls = 0

    async def slow_attempt() -> str:  # each attempt takes 1 s of the fake clock
        nonlocal calls
        sleeps.now += 1.0
        calls += 1
        raise errors[calls - 1]

    policy = RetryPolicy(max_attempts=10, initial_backoff_s=0.01, max_backoff_s=0.01, max_total_s=2.5)
    with pytest.raises(RetriesExhausted) as err:
        await retry_call(slow_attempt, policy=policy, idempotent=True, sleep=sleeps, clock=sleeps.clock)
    assert calls == 3  # at 1 s and 2 s a wait fits in 2.5 s; at 3 s none does
    assert (err.value.code, err.value.details) == (C.DEADLINE_EXCEEDED, "slow 2")


@pytest.mark.parametrize("code", [C.INVALID_ARGUMENT, C.PERMISSION_DENIED, C.NOT_FOUND, C.UNAUTHENTICATED])
async def test_does_not_retry_errors_that_sending_again_cannot_fix(code: grpc.StatusCode) -> None:
    attempt = Script(RpcError(code, "no"), "never")
    with pytest.raises(RpcError) as err:
        await run(attempt, router=Addresses("a", "b"))
    assert err.value.code is code
    assert attempt.calls == 1


async def test_a_call_that_is_not_idempotent_is_not_retried_on_unavailable_or_deadline() -> None:
    for code in (C.UNAVAILABLE, C.DEADLINE_EXCEEDED):
        attempt = Script(RpcError(code, "maybe ran"), "never")
        with pytest.raises(RpcError):
            await run(attempt, idempotent=False)
        assert attempt.calls == 1


async def test_deadline_exceeded_is_retried_when_idempotent() -> None:
    attempt = Script(RpcError(C.DEADLINE_EXCEEDED, "slow"), "answer")
    result, _ = await run(attempt, idempotent=True)
    assert (result, attempt.calls) == ("answer", 2)


async def test_follows_the_primary_a_refusal_names_at_once_even_for_a_call_that_is_not_idempotent() -> None:
    router = Addresses("a:1", "b:1")
    seen: list[str] = []
    refusal = RpcError(C.UNAVAILABLE, "not primary", {NOT_PRIMARY_METADATA: "1", PRIMARY_ADDRESS_METADATA: "c:1"})

    async def attempt() -> str:
        seen.append(router.current)
        if router.current != "c:1":
            raise refusal
        return "done on c:1"

    result, sleeps = await run(attempt, idempotent=False, router=router)
    assert result == "done on c:1"
    assert seen == ["a:1", "c:1"]
    assert sleeps.waits == []  # a redirect is followed at once


async def test_a_refusal_naming_no_primary_moves_to_the_next_address_after_a_backoff() -> None:
    router = Addresses("a:1", "b:1")
    seen: list[str] = []

    async def attempt() -> str:
        seen.append(router.current)
        if router.current == "a:1":
            raise RpcError(C.UNAVAILABLE, "not primary", {NOT_PRIMARY_METADATA: "1"})
        return "done"

    result, sleeps = await run(attempt, idempotent=False, router=router)
    assert (result, seen, len(sleeps.waits)) == ("done", ["a:1", "b:1"], 1)


async def test_a_not_primary_refusal_without_a_router_is_an_ordinary_unavailable() -> None:
    attempt = Script(RpcError(C.UNAVAILABLE, "not primary", {NOT_PRIMARY_METADATA: "1"}), "never")
    with pytest.raises(RpcError):
        await run(attempt, idempotent=False)
    assert attempt.calls == 1


async def test_an_unanswered_call_moves_the_router_on_even_when_it_is_not_retried() -> None:
    router = Addresses("a:1", "b:1")
    with pytest.raises(RpcError):
        await run(Script(RpcError(C.UNAVAILABLE, "down")), idempotent=False, router=router)
    assert router.current == "b:1"


def test_policy_rejects_bounds_that_cannot_work() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="initial_backoff_s"):
        RetryPolicy(initial_backoff_s=2.0, max_backoff_s=1.0)


async def test_a_call_that_never_reached_a_server_is_retried_for_any_method() -> None:
    refused = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused"
    attempt = Script(RpcError(C.UNAVAILABLE, refused), "answer")
    result, _ = await run(attempt, idempotent=False, unavailable_did_not_run=True)
    assert (result, attempt.calls) == ("answer", 2)
    # The connection lost after the server may have run it (a reviewer saw a Create applied twice so): raised.
    attempt = Script(RpcError(C.UNAVAILABLE, "Stream removed (Socket closed)"), "never")
    with pytest.raises(RpcError) as err:
        await run(attempt, idempotent=False, unavailable_did_not_run=True)
    assert attempt.calls == 1 and err.value.details == "Stream removed (Socket closed)"
    attempt = Script(RpcError(C.DEADLINE_EXCEEDED, "maybe ran"), "never")
    with pytest.raises(RpcError) as err:
        await run(attempt, idempotent=False, unavailable_did_not_run=True)
    assert not isinstance(err.value, RetriesExhausted)
    assert attempt.calls == 1
