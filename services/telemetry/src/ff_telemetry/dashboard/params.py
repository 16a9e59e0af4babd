"""Query parameters of the dashboard's API, checked: a malformed one is a 400 naming it, nothing is read."""

from __future__ import annotations

import json
import math
import re

from aiohttp import web

from ff_telemetry.core.model import Matcher, MatchOp

# label=value, label!=value, label=~regex, label!~regex
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)(=~|!~|!=|=)(.*)", re.DOTALL)
_OPS = {"=": MatchOp.EQUAL, "!=": MatchOp.NOT_EQUAL, "=~": MatchOp.REGEX, "!~": MatchOp.NOT_REGEX}
_METRIC = re.compile(r"[a-z][a-z0-9_]{0,63}")
MAX_MATCHERS = 16
MAX_PARAM_CHARS = 512


def json_error(cls: type[web.HTTPError], message: str) -> web.HTTPError:
    """An HTTP error of class ``cls`` with the JSON body ``{"error": message}``, to raise."""
    return cls(text=json.dumps({"error": message}), content_type="application/json")


def _bad_request(message: str) -> web.HTTPError:
    """A 400 with ``message``."""
    return json_error(web.HTTPBadRequest, message)


def _raw(request: web.Request, name: str) -> str | None:
    value = request.query.get(name)
    if value is not None and len(value) > MAX_PARAM_CHARS:
        raise _bad_request(f"{name}: longer than {MAX_PARAM_CHARS} characters")
    return value


def number(request: web.Request, name: str, default: float, *, lo: float, hi: float) -> float:
    """Query parameter ``name`` as a finite number in [lo, hi], ``default`` when absent; 400 otherwise."""
    raw = _raw(request, name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise _bad_request(f"{name}: {raw[:40]!r} is not a number") from None
    if not math.isfinite(value) or not lo <= value <= hi:
        raise _bad_request(f"{name}: must be a number in [{lo:g}, {hi:g}]")
    return value


def integer(request: web.Request, name: str, default: int, *, lo: int, hi: int) -> int:
    """Query parameter ``name`` as a whole number in [lo, hi], ``default`` when absent; 400 otherwise."""
    raw = _raw(request, name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or not lo <= int(raw) <= hi:
        raise _bad_request(f"{name}: must be a whole number in [{lo}, {hi}]")
    return int(raw)


def choice(request: web.Request, name: str, default: str, allowed: tuple[str, ...]) -> str:
    """Query parameter ``name``, one of ``allowed``, ``default`` when absent; 400 otherwise."""
    raw = _raw(request, name)
    if raw is None or raw == "":
        return default
    if raw not in allowed:
        raise _bad_request(f"{name}: one of {', '.join(allowed)}")
    return raw


def metric(request: web.Request) -> str:
    """What a task reported with ``hfai.telemetry.report(<metric>=...)``; default ``loss``."""
    raw = _raw(request, "metric") or "loss"
    if not _METRIC.fullmatch(raw):
        raise _bad_request("metric: a lower-case name as given to hfai.telemetry.report (e.g. loss, tokens_per_s)")
    return raw


def task_id(request: web.Request) -> int:
    """The ``{task_id}`` of the path as a positive id; 400 otherwise."""
    raw = request.match_info["task_id"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) == 0:
        raise _bad_request(f"task id: {raw[:40]!r} is not a task id")
    return int(raw)


def matchers(request: web.Request) -> tuple[Matcher, ...]:
    """Every ``match`` parameter (``label=value``, ``!=``, ``=~``, ``!~``)."""
    raws = request.query.getall("match", [])
    if len(raws) > MAX_MATCHERS:
        raise _bad_request(f"match: at most {MAX_MATCHERS}")
    out = []
    for raw in raws:
        found = _MATCHER.fullmatch(raw)
        if found is None or len(raw) > MAX_PARAM_CHARS:
            raise _bad_request(f"match: {raw[:40]!r} is not label=value, label!=value, label=~re or label!~re")
        try:
            out.append(Matcher.make(found[1], _OPS[found[2]], found[3]))
        except re.error as exc:
            raise _bad_request(f"match: bad regular expression {found[3][:40]!r}: {exc}") from None
    return tuple(out)
