"""Clients of mgmtd used by every service: routing, membership (register, heartbeat, T/2), tokens."""

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
    "lease_expired",
    "registry_validator",
]
