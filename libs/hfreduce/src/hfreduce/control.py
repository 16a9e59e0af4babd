"""Rendezvous and control plane: a small server on global rank 0 that forms the group and names failed ranks.

It tracks every rank's collective sequence number and liveness, and names the culprit when a collective fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import secrets
import selectors
import socket
import struct
import threading
import time
from typing import Any

from hfreduce.errors import RendezvousError

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
_POLL_S = 0.05
# Once the group is formed, the server rests this long after each wake-up, so that the progress reports of all
# ranks and of many collectives are read in one: every wake-up takes rank 0's CPU and its GIL from its collective,
# which at a message of a few KiB costs about as much as the collective itself. Replies wait at most this long.
_BATCH_S = 0.02
Message = dict[str, Any]
# one encoder for all messages: json.dumps with its own separators builds a new encoder per call, and every rank
# sends two progress reports per collective
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _send_msg(sock: socket.socket, msg: Message) -> None:
    """Send one framed message: its length (4 bytes, big-endian), then compact JSON."""
    body = _ENCODER.encode(msg).encode()
    sock.sendall(_HEADER.pack(len(body)) + body)


def _recv_msg(sock: socket.socket) -> Message:
    """One framed message; raises ConnectionError on EOF and TimeoutError on the socket timeout."""
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    decoded: Message = json.loads(_recv_exact(sock, size))
    return decoded


def _recv_exact(sock: socket.socket, nbytes: int) -> bytes:
    chunks, got = [], 0
    while got < nbytes:
        part = sock.recv(nbytes - got)
        if not part:
            raise ConnectionError("control connection closed")
        chunks.append(part)
        got += len(part)
    return b"".join(chunks)


@dataclasses.dataclass
class _RankState:
    hello: Message
    conn: socket.socket | None
    seq: int = 0  # collectives entered
    done: int = 0  # collectives finished
    op: str = ""
    since: float = dataclasses.field(default_factory=time.time)
    left: bool = False
    dead: bool = False
    died_at: float = 0.0
    asked_blame: bool = False  # it saw a failure itself: if it exits later it is a victim, not a cause


@dataclasses.dataclass
class _Blame:
    conn: socket.socket
    asker: int
    seq: int
    suspect: int
    kind: str
    arrived: float


class ControlServer:
    """Runs on global rank 0's process in a daemon thread; never on the data path."""

    def __init__(self, *, port: int, world_size: int, timeout_s: float, listener: socket.socket | None = None) -> None:
        """Listen on ``port``, or on ``listener`` when given; the thread starts with ``start()``.

        A ``listener`` is bound by the caller, e.g. on port 0 before publishing its address through a torch store.
        """
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.token = secrets.token_hex(6)
        self._grace_s = min(0.5, timeout_s / 4)
        self._listener = listener if listener is not None else socket.create_server(("", port), reuse_port=False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._bufs: dict[socket.socket, bytearray] = {}
        self._ranks: dict[int, _RankState] = {}
        self._conn_rank: dict[socket.socket, int] = {}
        self._blames: list[_Blame] = []
        self._mismatch: Message | None = None  # the first disagreement on a collective, which broke the group
        self._formed = False
        self._failed = False
        self._stop = threading.Event()
        self._deadline = time.monotonic() + timeout_s
        self._thread = threading.Thread(target=self._run, name="hfreduce-control", daemon=True)

    def start(self) -> None:
        """Start serving on the daemon thread; the ranks have ``timeout_s`` from construction to arrive."""
        self._thread.start()

    def stop(self, wait_for_ranks_s: float = 0.0) -> None:
        """Stop after every rank said goodbye or died, or after ``wait_for_ranks_s``."""
        end = time.monotonic() + wait_for_ranks_s
        while time.monotonic() < end and not all(r.left or r.dead for r in self._ranks.values()):
            time.sleep(0.01)
        self._stop.set()
        self._thread.join(timeout=5)

    def wait_settled(self, culprit: int, timeout_s: float) -> bool:
        """Wait until every rank but ``culprit`` has left, died, or asked who failed and had its answer.

        ``culprit`` is left out because it may hang and never ask. Waits at most ``timeout_s``; returns whether
        the ranks settled.

        Rank 0 calls this before it raises a peer failure: its process may exit right after, taking this server
        with it, and a rank that had not asked yet would then blame rank 0 instead of the rank that failed.
        """
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            pending = {b.asker for b in self._blames}
            ranks = [(r, s) for r, s in list(self._ranks.items()) if r != culprit]
            if all(s.left or s.dead or (s.asked_blame and r not in pending) for r, s in ranks):
                return True
            time.sleep(0.01)
        return False

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                events = self._sel.select(timeout=_POLL_S)
                for key, _ in events:
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._tick()
                if events and self._formed:
                    self._stop.wait(_BATCH_S)
        except Exception:
            logger.exception("hfreduce control server failed")
        finally:
            for sock in list(self._bufs):
                sock.close()
            self._sel.close()
            self._listener.close()

    def _accept(self) -> None:
        conn, _ = self._listener.accept()
        conn.settimeout(5.0)
        self._bufs[conn] = bytearray()
        self._sel.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        buf = self._bufs[conn]
        buf += data
        while len(buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buf)
            if len(buf) < _HEADER.size + size:
                break
            msg = json.loads(bytes(buf[_HEADER.size : _HEADER.size + size]))
            del buf[: _HEADER.size + size]
            self._handle(conn, msg)

    def _drop(self, conn: socket.socket) -> None:
        rank = self._conn_rank.pop(conn, None)
        if rank is not None and not self._ranks[rank].left:
            self._ranks[rank].dead = True
            self._ranks[rank].died_at = time.monotonic()
            logger.warning("hfreduce rank %d lost its control connection", rank)
        self._sel.unregister(conn)
        self._bufs.pop(conn, None)
        conn.close()

    def _handle(self, conn: socket.socket, msg: Message) -> None:
        kind = msg["type"]
        if kind == "hello":
            self._hello(conn, msg)
        elif kind == "status":
            self._reply(conn, {"type": "status", "token": self.token, "ranks": self.status()})
        elif kind in ("enter", "done", "bye"):
            state = self._ranks[msg["rank"]]
            if kind == "enter":
                state.seq, state.op, state.since = msg["seq"], msg["op"], time.time()
            elif kind == "done":
                state.done, state.since = msg["seq"], time.time()
            else:
                state.left = True
        elif kind == "mismatch":  # a rank found its ring neighbour calling another collective (the first counts)
            if self._mismatch is None:
                self._mismatch = {"rank": msg["rank"], "reason": msg["reason"]}
            self._ranks[msg["from"]].asked_blame = True  # it knows the cause: settled, and a victim if it exits
        elif kind == "blame":
            self._blames.append(_Blame(conn, msg["rank"], msg["seq"], msg["suspect"], msg["kind"], time.monotonic()))
            self._ranks[msg["rank"]].asked_blame = True  # after the append: wait_settled must see it pending

    def _hello(self, conn: socket.socket, msg: Message) -> None:
        rank = msg["rank"]
        problem = ""
        if msg["world_size"] != self.world_size:
            problem = f"rank {rank} expects world size {msg['world_size']}, rank 0 expects {self.world_size}"
        elif rank in self._ranks or not 0 <= rank < self.world_size:
            problem = f"duplicate or out-of-range rank {rank}"
        elif self._formed or self._failed:
            problem = "the group is already formed or failed"
        if problem:
            self._reply(conn, {"type": "error", "message": problem, "missing": []})
            return
        msg["host"] = msg.get("host") or conn.getpeername()[0]
        self._ranks[rank] = _RankState(hello=msg, conn=conn)
        self._conn_rank[conn] = rank
        if len(self._ranks) == self.world_size:
            self._formed = True
            table = [self._ranks[r].hello for r in range(self.world_size)]
            for r in range(self.world_size):
                self._reply(self._ranks[r].conn, {"type": "table", "token": self.token, "ranks": table})

    def _tick(self) -> None:
        if not self._formed and not self._failed and time.monotonic() > self._deadline:
            self._failed = True
            missing = sorted(set(range(self.world_size)) - set(self._ranks))
            for state in self._ranks.values():
                self._reply(
                    state.conn,
                    {
                        "type": "error",
                        "missing": missing,
                        "message": f"ranks {missing} did not arrive within {self.timeout_s:g} s",
                    },
                )
        still = []
        for blame in self._blames:
            answer = self._resolve(blame)
            if answer is None:
                still.append(blame)
            else:
                self._reply(blame.conn, {"type": "blame", **answer})
        self._blames = still

    def _resolve(self, blame: _Blame) -> Message | None:
        waited = time.monotonic() - blame.arrived
        if self._mismatch is not None:  # read before the death of the rank that sent it, if it exits after
            return dict(self._mismatch)
        # the first rank that died without having seen a failure itself is the root cause
        dead = sorted(
            (s.died_at, r) for r, s in self._ranks.items() if s.dead and not s.asked_blame and r != blame.asker
        )
        if dead:
            return {"rank": dead[0][1], "reason": "died (its process exited or was killed)"}
        if blame.kind == "closed" and waited < self._grace_s:
            return None  # a peer's socket closed: give its control connection a moment to show it died
        behind = sorted(r for r, s in self._ranks.items() if s.seq < blame.seq and r != blame.asker)
        if behind:
            state = self._ranks[behind[0]]
            what = "left the group" if state.left else "did not enter"
            return {"rank": behind[0], "reason": f"{what} collective {blame.seq} (it entered {state.seq})"}
        if waited < self._grace_s:
            return None
        suspect = self._ranks.get(blame.suspect)
        if suspect is not None and suspect.asked_blame and not suspect.dead and waited < self.timeout_s / 2:
            # the suspect saw a failure itself: a victim that shut its links; wait for the cause (a death this
            # server has not read yet on a loaded machine, or a rank that never entered) to show
            return None
        verb = "stopped responding" if blame.kind == "timeout" else "closed its connection"
        return {"rank": blame.suspect, "reason": f"{verb} during collective {blame.seq}"}

    def _reply(self, conn: socket.socket | None, msg: Message) -> None:
        if conn is None:
            return
        with contextlib.suppress(OSError):
            _send_msg(conn, msg)

    def status(self) -> list[Message]:
        """Every rank that has joined, by rank, in the form ``query_status`` documents (the server's thread)."""
        return [
            {
                "rank": r,
                "node_rank": s.hello["node_rank"],
                "local_rank": s.hello["local_rank"],
                "seq": s.seq,
                "done": s.done,
                "op": s.op,
                "since": s.since,
                "state": "dead" if s.dead else "left" if s.left else "in_collective" if s.seq > s.done else "idle",
            }
            for r, s in sorted(self._ranks.items())
        ]


class ControlClient:
    """A rank's connection to the control server (one request at a time, under a lock)."""

    def __init__(self, addr: str, port: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.sock = socket.create_connection((addr, port), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise RendezvousError(
                        f"rank 0 (control server at {addr}:{port}) did not arrive within {timeout_s:g} s: {exc}",
                        missing_ranks=(0,),
                    ) from exc
                time.sleep(0.05)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def local_host(self) -> str:
        """This rank's address on its route to rank 0, which the rendezvous tells its peers to connect to."""
        host: str = self.sock.getsockname()[0]
        return host

    def rendezvous(self, hello: Message) -> Message:
        """Send this rank's hello; return the table of all ranks, or raise RendezvousError."""
        self.sock.settimeout(self.timeout_s + 5.0)
        try:
            _send_msg(self.sock, {"type": "hello", **hello})
            reply = _recv_msg(self.sock)
        except (OSError, ConnectionError) as exc:
            raise RendezvousError(f"rendezvous failed: {exc}") from exc
        if reply["type"] != "table":
            raise RendezvousError(reply["message"], missing_ranks=tuple(reply.get("missing", ())))
        return reply

    def notify(self, msg: Message) -> None:
        """Fire and forget (progress reports); a broken control link shows up at the next request."""
        with self._lock, contextlib.suppress(OSError):
            _send_msg(self.sock, msg)

    def request(self, msg: Message, timeout_s: float) -> Message:
        """Send ``msg`` and wait at most ``timeout_s`` for the server's answer.

        Raises:
            TimeoutError: no answer within ``timeout_s``.
            ConnectionError: the server closed the connection.
        """
        with self._lock:
            self.sock.settimeout(timeout_s)
            _send_msg(self.sock, msg)
            return _recv_msg(self.sock)

    def close(self) -> None:
        """Close the connection; the server then marks this rank dead unless it said goodbye first."""
        self.sock.close()


def query_status(addr: str, port: int, timeout_s: float = 5.0) -> list[Message]:
    """Every rank's collective sequence number and state, read from outside the ranks' processes.

    Each entry has ``rank``, ``node_rank``, ``local_rank``, ``seq`` (collectives entered), ``done``
    (collectives finished), ``op``, ``since`` (unix time of the last change) and ``state``
    (``idle``, ``in_collective``, ``left`` or ``dead``).
    """
    with socket.create_connection((addr, port), timeout=timeout_s) as sock:
        _send_msg(sock, {"type": "status"})
        reply = _recv_msg(sock)
    ranks: list[Message] = reply["ranks"]
    return ranks
