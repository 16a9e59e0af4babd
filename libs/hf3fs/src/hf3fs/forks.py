"""gRPC does not survive ``fork()``: which processes may use a FileSystem (see ``hf3fs.fs``)."""

from __future__ import annotations

import os


class ForkedProcessError(RuntimeError):
    """A FileSystem used in a process forked after gRPC started in its parent (see ``hf3fs.fs``)."""


class Process:
    """What this process knows of gRPC and fork, as class attributes: one state per process, copied on fork."""

    grpc_started = False  # a FileSystem was made in this process: gRPC runs here
    forked_after_grpc = False  # this process is a fork() child of one where gRPC ran


def _mark_fork_child() -> None:
    Process.forked_after_grpc = Process.forked_after_grpc or Process.grpc_started


os.register_at_fork(after_in_child=_mark_fork_child)


def fork_error(what: str) -> ForkedProcessError:
    """The error for ``what`` (a call) in a fork child of a gRPC process; it says how to start workers instead."""
    return ForkedProcessError(
        f"{what} in a process forked after gRPC started in its parent: gRPC cannot work after fork(). Start "
        "worker processes with 'spawn' or 'forkserver' (torch: DataLoader(..., multiprocessing_context="
        "'forkserver')); a FileSystem passed to them pickles and connects again there"
    )
