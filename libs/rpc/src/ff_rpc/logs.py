"""JSON-lines logs with request ids (and any other ids) stamped on every record from contextvars."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

_log_fields: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("ff_log_fields", default=None)

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Stamp ``fields`` (request_id, task_id, rank...) on every record logged inside the block."""
    current = _log_fields.get() or {}
    token = _log_fields.set({**current, **fields})
    try:
        yield
    finally:
        _log_fields.reset(token)


def set_log_fields(**fields: Any) -> None:
    """Stamp ``fields`` on every later record of this context (a task: grpc.aio runs a call per task)."""
    _log_fields.set({**(_log_fields.get() or {}), **fields})


def current_request_id() -> str | None:
    """The request id stamped on this context's records, if any (what a client forwards), without a copy."""
    fields = _log_fields.get()
    rid = fields.get("request_id") if fields else None
    return None if rid is None else str(rid)


def current_log_fields() -> dict[str, Any]:
    """A copy of the fields stamped on this context's records (the client forwards its request id from here)."""
    return dict(_log_fields.get() or {})


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, msg, service, context fields, extras, exception."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line; values JSON cannot hold are written as their ``str``."""
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "service": self._service,
        }
        out.update(current_log_fields())
        out.update({k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(service: str, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Only ``__main__`` calls this: JSON lines to stdout (the appliance sends them to a log file)."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.Formatter.converter = time.gmtime
