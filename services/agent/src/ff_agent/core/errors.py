"""The agent's one exception hierarchy (ff_agent.errors maps each to one status code)."""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error the agent answers with."""


class InvalidRequest(AgentError):
    """Malformed, missing or out-of-range fields (unknown devices, empty command, no token); nothing launched."""


class NotFoundError(AgentError):
    """A run this node does not have."""


class Busy(AgentError):
    """The node cannot do this now (e.g. validate while a run is active, without ``force``)."""


class CannotRunAs(AgentError):
    """This agent cannot run the ranks as the task's user (it is not root); nothing launched."""
