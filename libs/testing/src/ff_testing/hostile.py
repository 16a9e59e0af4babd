"""Helpers for hostile-input tests of any service: raw request bytes on the wire, a process's memory."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ff_rpc.auth import AUTHORIZATION_HEADER, BEARER_PREFIX

# Bytes no protobuf message parses: a truncated varint key, a length past the end, a bad wire type,
# an 11-byte varint. (Invalid UTF-8 in a string field is refused only by messages with string fields.)
MALFORMED_MESSAGES: tuple[bytes, ...] = (b"\xff", b"\x0a\x05ab", b"\x07", b"\x08" + b"\xff" * 11)


@dataclass(frozen=True)
class RawAnswer:
    """What a call with raw bytes got: its status and the raw response messages."""

    code: grpc.StatusCode
    details: str
    messages: list[bytes] = field(default_factory=list)


async def call_raw(
    channel: grpc.aio.Channel,
    method: str,
    requests: Sequence[bytes],
    *,
    token: str = "",
    request_stream: bool = False,
    response_stream: bool = False,
    max_messages: int | None = None,
    timeout_s: float = 10.0,
) -> RawAnswer:
    """Call ``/pkg.Service/Method`` with ``requests`` as they are (no serializer); the status and raw answers.

    As a client of any language with a corrupt encoder would; a unary request sends ``requests[0]``. A response
    stream is read to its end, or (``max_messages``) until that many messages came, then cancelled: OK.
    """
    metadata = ((AUTHORIZATION_HEADER, BEARER_PREFIX + token),) if token else ()
    raw = {"request_serializer": _same, "response_deserializer": _same}
    try:
        if request_stream and response_stream:
            stream_call = channel.stream_stream(method, **raw)(_iterate(requests), metadata=metadata, timeout=timeout_s)
            return RawAnswer(grpc.StatusCode.OK, "", [m async for m in stream_call])
        if request_stream:
            reply = await channel.stream_unary(method, **raw)(_iterate(requests), metadata=metadata, timeout=timeout_s)
            return RawAnswer(grpc.StatusCode.OK, "", [reply])
        if response_stream:
            unary_stream = channel.unary_stream(method, **raw)(requests[0], metadata=metadata, timeout=timeout_s)
            got: list[bytes] = []
            async for message in unary_stream:
                got.append(message)
                if max_messages is not None and len(got) >= max_messages:
                    unary_stream.cancel()
                    break
            return RawAnswer(grpc.StatusCode.OK, "", got)
        reply = await channel.unary_unary(method, **raw)(requests[0], metadata=metadata, timeout=timeout_s)
        return RawAnswer(grpc.StatusCode.OK, "", [reply])
    except grpc.aio.AioRpcError as err:
        return RawAnswer(err.code(), err.details() or "")


def _same(data: bytes) -> bytes:
    return data


async def _iterate(items: Sequence[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item


@dataclass(frozen=True)
class Hostile:
    """One hostile call: what it is, the method, the request bytes, the caller's token and the status it must get.

    The method is ``/pkg.Service/Method``; the request bytes are usually a message's ``SerializeToString()``.
    """

    what: str
    method: str
    request: bytes
    code: grpc.StatusCode
    token: str = ""
    response_stream: bool = False
    max_messages: int | None = None


@dataclass(frozen=True)
class Bounds:
    """What one request may cost the service: time to its answer, growth of resident and peak memory."""

    max_seconds: float = 10.0
    max_rss_growth_kib: int = 64 * 1024
    max_peak_growth_kib: int = 256 * 1024


async def check_hostile(
    channel: grpc.aio.Channel,
    pid: int,
    case: Hostile,
    still_serving: Callable[[], Awaitable[object]],
    bounds: Bounds = Bounds(),
) -> list[str]:
    """Send ``case`` to the service in process ``pid``; what went wrong (empty: nothing).

    Checked: the status is ``case.code``, the answer came within ``bounds.max_seconds`` (the call's
    deadline, so a stuck service shows as DEADLINE_EXCEEDED), the process's resident memory and its peak
    (reset before the call where the kernel lets us) grew within the bounds, and ``still_serving()`` works.
    """
    _reset_peak(pid)
    rss, peak = rss_kib(pid), peak_rss_kib(pid)
    started = time.monotonic()
    answer = await call_raw(
        channel,
        case.method,
        [case.request],
        token=case.token,
        response_stream=case.response_stream,
        max_messages=case.max_messages,
        timeout_s=bounds.max_seconds,
    )
    took_s = time.monotonic() - started
    problems = []
    if answer.code != case.code:
        problems.append(f"{case.what}: {answer.code.name} ({answer.details[:200]!r}), expected {case.code.name}")
    if took_s > bounds.max_seconds:
        problems.append(f"{case.what}: answered after {took_s:.1f}s")
    grown, peaked = rss_kib(pid) - rss, peak_rss_kib(pid) - peak
    if grown > bounds.max_rss_growth_kib or peaked > bounds.max_peak_growth_kib:
        problems.append(f"{case.what}: memory grew {grown} KiB (peak +{peaked} KiB)")
    try:
        await still_serving()
    except Exception as exc:  # any failure of the follow-up call is what this check reports
        problems.append(f"{case.what}: the service no longer serves ({exc})")
    return problems


def _reset_peak(pid: int) -> None:
    """Reset the process's peak resident size (VmHWM) to its current size (Linux 4.0+, own or root)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` in KiB (VmRSS of /proc/<pid>/status)."""
    return _status_kib(pid, "VmRSS")


def peak_rss_kib(pid: int) -> int:
    """Peak resident memory of process ``pid`` in KiB (VmHWM): catches a spike freed before it is read."""
    return _status_kib(pid, "VmHWM")


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise LookupError(f"no {key} in /proc/{pid}/status")


def client_method(rpc: str) -> str:
    """The typed client's method of the RPC ``rpc`` (``BatchStat``: ``batch_stat``), for tests over many RPCs."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])|(?<=[A-Z])([A-Z])(?=[a-z])", r"_\1\2", rpc).lower()
