"""Helpers for hostile-input tests of any service: raw request bytes on the wire, a process's memory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
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
    timeout_s: float = 10.0,
) -> RawAnswer:
    """Call ``/pkg.Service/Method`` with ``requests`` as they are (no serializer), as a client of any
    language with a corrupt encoder would; a unary request sends ``requests[0]``."""
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
            return RawAnswer(grpc.StatusCode.OK, "", [m async for m in unary_stream])
        reply = await channel.unary_unary(method, **raw)(requests[0], metadata=metadata, timeout=timeout_s)
        return RawAnswer(grpc.StatusCode.OK, "", [reply])
    except grpc.aio.AioRpcError as err:
        return RawAnswer(err.code(), err.details() or "")


def _same(data: bytes) -> bytes:
    return data


async def _iterate(items: Sequence[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item


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
