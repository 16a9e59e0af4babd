"""Clients of mgmtd every service uses (routing, membership, tokens) and the service chassis built on them."""

from ff_cluster.chassis import ServiceWiring, Serving, cancel_on_stop, serve_service
from ff_cluster.lease import LeaseWatch, lease_expired
from ff_cluster.membership import MembershipOptions, NodeMembership
from ff_cluster.mgmtd_client import MgmtdClient
from ff_cluster.token_validator import MgmtdTokenValidator, registry_validator

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
