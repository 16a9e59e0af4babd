"""``save``, ``load`` and the handle of a save running in the background (see the package docstring)."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any

import torch

from haiscale.checkpoint import leases, loader, saver
from haiscale.checkpoint.loader import Loaded
from haiscale.checkpoint.manifest import MANIFEST
from haiscale.checkpoint.saver import CheckpointError, Snapshot
from haiscale.checkpoint.storage import Location, locate
from haiscale.telemetry import default_sink, send

logger = logging.getLogger(__name__)

MAX_SAVE_ID_CHARS = 64  # it is part of file names (at most 255 bytes)
LOAD_ATTEMPTS = 3  # looks for the newest checkpoint, when the one found is pruned before its lease is taken


class SaveHandle:
    """One save: its snapshot is taken; ``wait()`` returns once it is written (and, on rank 0, committed)."""

    def __init__(self, step: int, loc: Location) -> None:
        self.step = step
        self._loc = loc
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._error_seen = False
        self.manifest_url: str | None = None
        self.removed_steps: list[int] = []
        self.reported = False

    def done(self) -> bool:
        """Whether the save finished (committed, or failed)."""
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> str | None:
        """Wait for the save; the committed manifest's URL on rank 0 (None on other ranks).

        Raises:
            TimeoutError: not finished within ``timeout_s``.
            CheckpointError, OSError: the save failed (nothing of it counts; earlier checkpoints are intact).
        """
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"the save of step {self.step} did not finish within {timeout_s} s")
        if self._error is not None:
            self._error_seen = True
            raise self._error
        return self.manifest_url

    def _run(self, snap: Snapshot, keep: int | None, report: bool, part_timeout_s: float, keep_buffer: bool) -> None:
        try:
            started = time.perf_counter()
            folder = saver.step_folder(snap.step)
            self._loc.storage.makedirs(self._loc.join(folder))
            with leases.held(self._loc, folder, "save") as lease:  # no other save's prune removes it meanwhile
                part = saver.write_rank(self._loc, snap)
                if snap.rank == 0:
                    path = saver.commit(self._loc, snap, part, part_timeout_s, lease)
            if snap.rank == 0:
                self.manifest_url = f"hf3fs://{path}" if self._loc.in_3fs else path
                try:
                    self.removed_steps = saver.prune(self._loc, snap.step, keep)
                except Exception as err:  # committed already, so the save succeeded: the old ones go at a later save
                    logger.warning("step %d committed; removing older checkpoints failed: %r", snap.step, err)
                self.reported = report and self._report(path, snap)
            seconds = time.perf_counter() - started
            send(default_sink(), checkpoint_save_seconds=seconds, checkpoint_save_bytes=snap.buffer.numel())
            if keep_buffer:
                _InFlight.spare = snap.allocation
        except BaseException as err:  # kept for wait() and the next save(), and logged now: a process that ends
            self._error = err  # after its last save calls neither, and its failure would go unseen
            logger.error("the save of step %d failed, nothing of it counts: %r", snap.step, err, exc_info=err)
        finally:
            self._done.set()

    def _report(self, path: str, snap: Snapshot) -> bool:
        """``saver.report``; a failure is logged, not raised: the checkpoint is committed, it counts all the same."""
        try:
            return saver.report(self._loc, path, snap.step, snap.taken_at)
        except Exception as err:  # (the run's folder gone, a path the scheduler cannot hold...)
            logger.error("step %d is committed, but reporting it to the scheduler failed: %r", snap.step, err)
            return False


class _InFlight:
    """This process's save in flight (at most one)."""

    lock = threading.Lock()
    starting = threading.Lock()  # held by a save() from its wait for the one in flight until its own is started
    handle: SaveHandle | None = None
    spare: torch.Tensor | None = None  # a finished save's host buffer, kept for the next snapshot (keep_buffer)


def _finish_in_flight() -> None:
    """Wait for this process's save in flight; raise its error if it failed and nobody has seen it."""
    with _InFlight.lock:
        handle, _InFlight.handle = _InFlight.handle, None
    if handle is None:
        return
    handle._done.wait()
    if handle._error is not None and not handle._error_seen:
        handle._error_seen = True
        raise CheckpointError(f"the previous save (step {handle.step}) failed: {handle._error}") from handle._error


def _ranks(rank: int | None, world_size: int | None, group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if group is not None or (rank is None and dist.is_available() and dist.is_initialized()):
        return dist.get_rank(group), dist.get_world_size(group)
    r, w = rank or 0, world_size or 1
    if not 0 <= r < w:
        raise ValueError(f"rank {r} is not in 0..{w - 1}")
    return r, w


def _save_id(save_id: str | None, rank: int, world_size: int, group: Any) -> str:
    """The id every rank's files of this save carry, so a commit never mixes in files of a killed save."""
    if save_id is not None:
        if not save_id.isalnum() or len(save_id) > MAX_SAVE_ID_CHARS:
            raise ValueError(f"save_id must be 1 to {MAX_SAVE_ID_CHARS} letters and digits, not {save_id[:80]!r}")
        return save_id
    if world_size == 1:
        return uuid.uuid4().hex[:16]
    import torch.distributed as dist

    if group is None and not (dist.is_available() and dist.is_initialized()):
        raise ValueError("a save on several ranks without a process group needs the same save_id on every rank")
    box = [uuid.uuid4().hex[:16] if rank == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return str(box[0])


def save(
    path: str | os.PathLike[str],
    state_dict: dict[Any, Any],
    *,
    step: int,
    blocking: bool = False,
    keep: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    group: Any = None,
    save_id: str | None = None,
    fs: Any = None,
    report: bool = True,
    part_timeout_s: float = 600.0,
    keep_buffer: bool = False,
) -> SaveHandle:
    """Save ``state_dict`` as checkpoint ``step`` under the root ``path``.

    Returns once every tensor this rank writes is copied to host memory: changing them afterwards does not
    change the checkpoint. The write runs in a background thread unless ``blocking``; a process has at most
    one save in flight, so a second ``save`` first waits for the first (and raises ``CheckpointError`` if
    that one failed and its handle's ``wait()`` was never called). Call ``save`` on every rank.

    Args:
        path: the checkpoint root: ``hf3fs:///a/b`` (3FS, through the batch API) or a folder of this machine
            (a local disk, or a 3FS FUSE mount).
        state_dict: a tree of dicts of tensors (rank 0 writes them), ``Shard``s (each rank its own) and other
            picklable values (rank 0's are kept).
        step: the checkpoint's number; its folder is ``step-<step, 9 digits>``.
        blocking: return only once the write has finished (as ``wait()`` does, raising its error).
        keep: once committed, keep only the newest ``keep`` checkpoints (None: all).
        rank: this rank, when there is no ``group`` and torch.distributed is not initialized (default 0).
        world_size: the number of ranks saving, in the same case (default 1).
        group: the process group of the saving ranks, which gives rank and world size (default: the default
            process group when torch.distributed is initialized and ``rank`` is not given).
        save_id: the same string on every rank when several ranks save without a process group.
        fs: the ``hf3fs.FileSystem`` for 3FS paths (default: one connection from FF_MGMTD_ADDRESSES/FF_TOKEN).
        report: when committed in 3FS inside an HAI task, report it to the scheduler (rank 0).
        part_timeout_s: how long rank 0 waits for the other ranks' files before giving the save up.
        keep_buffer: once written, keep this save's host buffer for the next save's snapshot, which copies into
            it when it fits (pages already touched: no page faults, about 2.5x less CPU for the copy), as
            torch.distributed.checkpoint's cached staging does. It holds memory the size of this rank's state
            between saves; the next save without ``keep_buffer`` uses it and lets it go.

    Raises:
        FileExistsError: checkpoint ``step`` is already committed (nothing is written).
        CheckpointError: the previous save of this process failed unseen.
    """
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
        raise ValueError(f"step must be an integer in 0..2**63-1 (what the scheduler stores), not {step!r}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1, not {keep}")
    r, w = _ranks(rank, world_size, group)
    loc = locate(path, fs)
    with _InFlight.starting:  # threads of one process take turns: one save in flight, its handle the one kept
        _finish_in_flight()
        if loc.storage.exists(loc.join(saver.step_folder(step), MANIFEST)):
            raise FileExistsError(f"{loc.url(saver.step_folder(step))}: checkpoint {step} is already committed")
        started = time.perf_counter()
        spare, _InFlight.spare = _InFlight.spare, None  # no save in flight: nobody else holds it
        snap = saver.take_snapshot(state_dict, step, r, w, _save_id(save_id, r, w, group), spare)
        send(default_sink(), checkpoint_snapshot_seconds=time.perf_counter() - started)
        handle = SaveHandle(step, loc)
        with _InFlight.lock:
            _InFlight.handle = handle
        threading.Thread(
            target=handle._run, args=(snap, keep, report, part_timeout_s, keep_buffer), name=f"haiscale-save-{step}"
        ).start()  # not a daemon: the interpreter waits for it at exit
    if blocking:
        handle.wait()
    return handle


def wait_for_saves() -> None:
    """Wait for this process's save in flight, if any (raising its error if nobody saw it)."""
    _finish_in_flight()


def latest_step(path: str | os.PathLike[str], *, fs: Any = None) -> int | None:
    """The step of the newest committed checkpoint under ``path``; None when there is none."""
    steps = saver.committed_steps(locate(path, fs))
    return steps[-1] if steps else None


def load(
    path: str | os.PathLike[str],
    state_dict: dict[Any, Any],
    *,
    step: int | None = None,
    allocate_missing: bool = False,
    in_place: bool = True,
    trusted: bool = False,
    fs: Any = None,
) -> Loaded:
    """Read a checkpoint into ``state_dict``: its tensors and ``Shard``s in place, its other values set.

    The state dict is matched against the checkpoint first: a mismatch raises before anything changes. Then the
    bytes are read in one batch, each saved slice straight into the caller's tensor when it can (a contiguous CPU
    tensor holding the whole slice: no staging buffer, no copy, as torch.distributed.checkpoint loads), and every
    slice is checked against its checksum.

    Args:
        path: a checkpoint root (the newest committed checkpoint, or ``step``'s) or one checkpoint's folder.
        step: the checkpoint to read under a root (default: the newest committed one); not used when ``path``
            is one checkpoint's folder.
        state_dict: the structure to fill; every tensor must have the saved dtype and (global) shape, each
            ``Shard`` any slice, whichever ranks saved it.
        allocate_missing: tensors the checkpoint has and ``state_dict`` lacks (an optimizer that has not
            stepped yet) are made and set, instead of being a mismatch.
        in_place: read into the tensors themselves and check after (fast; bytes that fail their checksum are left
            in the tensors read so far). False: read into staging buffers, check everything, then copy, so a
            corrupt checkpoint changes nothing (a copy of every byte more, and the staging memory).
        trusted: the checkpoint was written by someone you trust: its pickled values may name any class or
            function (unpickling rebuilds, so runs, what they name). Without it only the types training state holds
            load (``loader.SAFE_GLOBALS``: Python and numpy RNG states, numpy arrays, torch sizes and dtypes,
            containers, times), as torch.load's ``weights_only``.
        fs: the ``hf3fs.FileSystem`` for 3FS paths (default: one connection from FF_MGMTD_ADDRESSES/FF_TOKEN).

    Raises:
        FileNotFoundError: no committed checkpoint there.
        UntrustedValues: not ``trusted``, and the values name something else; nothing changed (the values are
            rebuilt before any tensor is read).
        CheckpointMismatch: the first tensor or value that does not match; ``state_dict`` is unchanged.
        CorruptCheckpoint: bytes that fail their checksum (names the first such tensor); no value is set and, not
            ``in_place``, no tensor changed.
    """
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"step is an integer or None, not {step!r}")  # (True would load step 1)
    _finish_in_flight()
    started = time.perf_counter()
    loc = locate(path, fs)
    for _ in range(LOAD_ATTEMPTS):
        folder = loader.find_checkpoint(loc, step)
        if folder is None:
            break
        with leases.held(loc, folder, "load"):  # taken before the manifest is read: no prune removes it meanwhile
            try:
                manifest = loader.read_manifest(loc, folder)
            except FileNotFoundError:
                continue  # pruned between the look and the lease: look again
            loader.read_into(loc, folder, manifest, state_dict, allocate_missing, in_place, trusted)
        send(default_sink(), checkpoint_load_seconds=time.perf_counter() - started)
        return Loaded(manifest.step, loc.url(folder), manifest.world_size)
    what = f"checkpoint {step}" if step is not None else "committed checkpoint"
    raise FileNotFoundError(f"{loc.url()}: no {what}")
