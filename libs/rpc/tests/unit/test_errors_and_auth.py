from __future__ import annotations

import io
import json
import logging

import grpc
import pytest

from ff_rpc import (
    Access,
    CachingTokenValidator,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Principal,
    RetryPolicy,
    Role,
    StatusTable,
    TokenCheck,
    Unauthenticated,
)
from ff_rpc.auth import CLUSTER_PRINCIPAL, authorize, bearer_token, is_cluster_token, method_access
from ff_rpc.client import is_idempotent
from ff_rpc.logs import JsonFormatter, set_log_fields
from fireflyer.mgmtd.v1 import mgmtd_pb2  # noqa: F401  (loads the descriptors the lookups read)


class DomainError(Exception):
    pass


class MissingThing(DomainError):
    pass


class StaleThing(DomainError):
    pass


TABLE = StatusTable({DomainError: grpc.StatusCode.FAILED_PRECONDITION, MissingThing: grpc.StatusCode.NOT_FOUND})


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (MissingThing(), grpc.StatusCode.NOT_FOUND),  # nearest class wins
        (StaleThing(), grpc.StatusCode.FAILED_PRECONDITION),  # inherits its base's code
        (InvalidArgument("x"), grpc.StatusCode.INVALID_ARGUMENT),  # ff_rpc errors carry their code
        (NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (ValueError("bug"), None),  # unmapped: INTERNAL, decided by the interceptor
    ],
)
def test_status_table_maps_by_class_hierarchy(exc: Exception, code: grpc.StatusCode | None) -> None:
    assert TABLE.code_for(exc) == code


def test_method_access_comes_from_the_proto_option() -> None:
    assert method_access("/fireflyer.mgmtd.v1.MgmtdService/GetPrimary") is Access.PUBLIC
    assert method_access("/fireflyer.mgmtd.v1.MgmtdService/GetRoutingInfo") is Access.USER
    assert method_access("/fireflyer.mgmtd.v1.MgmtdService/SetChains") is Access.ADMIN
    assert method_access("/fireflyer.mgmtd.v1.MgmtdService/Heartbeat") is Access.CLUSTER
    # Unknown fireflyer methods fail closed; other packages (health, reflection) carry no rule.
    assert method_access("/fireflyer.mgmtd.v1.MgmtdService/NoSuchMethod") is Access.CLUSTER
    assert method_access("/grpc.health.v1.Health/Check") is None
    assert method_access("/other.pkg.v1.Service/Method") is Access.CLUSTER


def test_idempotency_comes_from_the_proto_option() -> None:
    assert is_idempotent("/fireflyer.mgmtd.v1.MgmtdService/Heartbeat")
    assert is_idempotent("/fireflyer.mgmtd.v1.MgmtdService/GetRoutingInfo")
    assert not is_idempotent("/fireflyer.mgmtd.v1.MgmtdService/SetChains")
    assert not is_idempotent("/fireflyer.mgmtd.v1.IdentityService/IssueToken")
    assert not is_idempotent("/no.such.Service/Method")


ALICE = Principal(uid=1000, name="alice")
ROOT = Principal(uid=1, name="root", role=Role.ADMIN)


@pytest.mark.parametrize(
    ("access", "principal", "allowed"),
    [
        (Access.USER, ALICE, True),
        (Access.ADMIN, ALICE, False),
        (Access.ADMIN, ROOT, True),
        (Access.CLUSTER, ROOT, False),
        (Access.CLUSTER, CLUSTER_PRINCIPAL, True),
        (Access.ADMIN, CLUSTER_PRINCIPAL, True),
    ],
)
def test_authorize(access: Access, principal: Principal, allowed: bool) -> None:
    if allowed:
        authorize(access, principal)
    else:
        with pytest.raises(PermissionDenied):
            authorize(access, principal)


def test_bearer_token_parsing() -> None:
    assert bearer_token((("authorization", "Bearer abc"),)) == "abc"
    assert bearer_token((("x-other", "1"),)) is None
    with pytest.raises(Unauthenticated, match="Bearer"):
        bearer_token((("authorization", "Basic abc"),))


def test_cluster_token_comparison() -> None:
    assert is_cluster_token("s3cret", "s3cret")
    assert not is_cluster_token("s3cret", "other")
    assert not is_cluster_token("", "")  # an unset cluster token matches nothing


class CountingChecker:
    def __init__(self, valid_for_s: float = 60.0) -> None:
        self.calls = 0
        self.valid_for_s = valid_for_s

    async def check(self, token: str) -> TokenCheck:
        self.calls += 1
        if not token.startswith("good"):
            raise Unauthenticated("unknown token")
        return TokenCheck(ALICE, self.valid_for_s)


async def test_caching_validator_caches_answers_and_rejections_for_their_ttl() -> None:
    inner = CountingChecker()
    now = [100.0]
    cache = CachingTokenValidator(inner, ttl_s=5.0, negative_ttl_s=1.0, clock=lambda: now[0])
    assert await cache.validate("good") == ALICE
    assert await cache.validate("good") == ALICE
    assert inner.calls == 1
    for _ in range(3):
        with pytest.raises(Unauthenticated, match="unknown token"):
            await cache.validate("bad")
    assert inner.calls == 2
    now[0] += 1.5  # the rejection expired, the acceptance not yet
    with pytest.raises(Unauthenticated):
        await cache.validate("bad")
    assert await cache.validate("good") == ALICE
    assert inner.calls == 3
    now[0] += 5.0
    await cache.validate("good")
    assert inner.calls == 4


def test_backoff_is_capped_exponential_with_jitter() -> None:
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0, multiplier=2.0)
    assert [policy.backoff_s(n, rand=lambda: 1.0) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert policy.backoff_s(3, rand=lambda: 0.5) == pytest.approx(0.2)


def test_json_log_lines_carry_context_fields() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("svc"))
    log = logging.getLogger("ff_rpc_test_json")
    log.addHandler(handler)
    log.propagate = False
    set_log_fields(request_id="r-1")
    log.warning("hello %s", "world", extra={"node_id": 7})
    record = json.loads(stream.getvalue())
    assert record["msg"] == "hello world"
    assert record["service"] == "svc"
    assert record["request_id"] == "r-1"
    assert record["node_id"] == 7
    assert record["level"] == "WARNING"


async def test_cache_never_outlives_what_the_registry_allows() -> None:
    inner = CountingChecker(valid_for_s=2.0)  # e.g. the token expires in 2 s
    now = [0.0]
    cache = CachingTokenValidator(inner, ttl_s=5.0, clock=lambda: now[0])
    await cache.validate("good")
    now[0] = 1.9
    await cache.validate("good")
    assert inner.calls == 1
    now[0] = 2.1
    await cache.validate("good")
    assert inner.calls == 2


async def test_cache_evicts_least_recently_used() -> None:
    inner = CountingChecker()
    cache = CachingTokenValidator(inner, max_entries=2, clock=lambda: 0.0)
    await cache.validate("good-a")
    await cache.validate("good-b")
    await cache.validate("good-a")  # a is now the most recent
    for junk in ("junk-1", "junk-2", "junk-3"):
        with pytest.raises(Unauthenticated):
            await cache.validate(junk)
    calls = inner.calls
    await cache.validate("good-a")  # evicted by the junk flood: asked again
    assert inner.calls == calls + 1
    assert len(cache._entries) == 2


def test_error_details_are_bounded() -> None:
    from ff_rpc.interceptor import MAX_DETAILS_CHARS, bounded_details

    assert bounded_details("short") == "short"
    cut = bounded_details("n" * (MAX_DETAILS_CHARS + 5000))
    assert cut.startswith("n" * MAX_DETAILS_CHARS) and cut.endswith("... (5000 more characters)")
    assert len(cut) < MAX_DETAILS_CHARS + 40
