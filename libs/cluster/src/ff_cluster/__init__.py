"""Clients of mgmtd every service uses (routing, membership, tokens) and the service chassis built on them.

The names are imported on first use (PEP 562): ``from ff_cluster import MgmtdClient`` in a client (``hf3fs``,
``hfai``, a training rank) loads the client, not the service chassis and its settings (pydantic, ff_config), about a
third of ``import hf3fs``; and ``ff_cluster.lease``, which is pure, can be imported without grpc.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ff_cluster.chassis import ServiceWiring, Serving, cancel_on_stop, serve_service
    from ff_cluster.lease import LeaseWatch, lease_expired
    from ff_cluster.membership import MembershipOptions, NodeMembership
    from ff_cluster.mgmtd_client import MgmtdClient
    from ff_cluster.token_validator import MgmtdTokenValidator, registry_validator

_MODULE_OF = {
    "LeaseWatch": "lease",
    "MembershipOptions": "membership",
    "MgmtdClient": "mgmtd_client",
    "MgmtdTokenValidator": "token_validator",
    "NodeMembership": "membership",
    "ServiceWiring": "chassis",
    "Serving": "chassis",
    "cancel_on_stop": "chassis",
    "lease_expired": "lease",
    "registry_validator": "token_validator",
    "serve_service": "chassis",
}

__all__ = [
    "LeaseWatch",
    "MembershipOptions",
    "MgmtdClient",
    "MgmtdTokenValidator",
    "NodeMembership",
    "ServiceWiring",
    "Serving",
    "cancel_on_stop",
    "lease_expired",
    "registry_validator",
    "serve_service",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'ff_cluster' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ff_cluster.{module}"), name)
    globals()[name] = value  # the next lookup is a plain global
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])
