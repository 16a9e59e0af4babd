"""Links between the ranks of one node: an AF_UNIX star around local rank 0, for barriers and shared-memory fds.

The sockets live in the abstract namespace, so nothing is left on disk.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from hfreduce.errors import HFReduceError, RendezvousError
from hfreduce.transport import Link, LinkError, recv_exact

_SIGNATURE = struct.Struct("!Q")
_OK, _MISMATCH = b"\x01", b"\x00"
_MASK = 2**64 - 1


class LocalComm:
    """Barrier and fd exchange among the ``num_local`` ranks of a node (``ranks[i]`` = global rank)."""

    def __init__(self, *, name: str, local_rank: int, ranks: list[int], timeout_s: float) -> None:
        self.local_rank = local_rank
        self.ranks = ranks
        self.timeout_s = timeout_s
        self.links: dict[int, Link] = {}  # local rank -> link (leader: all others; others: the leader)
        address = "\0" + name
        if len(ranks) == 1:
            return
        if local_rank == 0:
            self._accept_all(address)
        else:
            self._connect(address)

    def _accept_all(self, address: str) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(address)
            listener.listen(len(self.ranks))
            listener.settimeout(self.timeout_s)
            while len(self.links) < len(self.ranks) - 1:
                try:
                    conn, _ = listener.accept()
                except TimeoutError as exc:
                    missing = [self.ranks[i] for i in range(1, len(self.ranks)) if i not in self.links]
                    raise RendezvousError(
                        f"local ranks {missing} did not connect within {self.timeout_s:g} s",
                        missing_ranks=tuple(missing),
                    ) from exc
                conn.settimeout(self.timeout_s)
                (peer,) = struct.unpack("!I", recv_exact(conn, 4))
                self.links[peer] = Link(conn, self.ranks[peer], self.timeout_s)

    def _connect(self, address: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(address)
                break
            except OSError as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise RendezvousError(
                        f"local rank 0 (rank {self.ranks[0]}) did not listen within {self.timeout_s:g} s",
                        missing_ranks=(self.ranks[0],),
                    ) from exc
                time.sleep(0.02)
        sock.sendall(struct.pack("!I", self.local_rank))
        self.links[0] = Link(sock, self.ranks[0], self.timeout_s)

    def barrier(self, signature: int = 0, payload: bytes = b"") -> list[bytes]:
        """Wait for every local rank; all must pass the same ``signature`` (collective, size, buffer).

        Every rank passes a ``payload`` of the same length; each gets all of them, in local-rank order.
        """
        if len(self.ranks) == 1:
            return [payload]
        size = len(payload)
        sig = _SIGNATURE.pack(signature & _MASK)
        if self.local_rank != 0:
            link = self.links[0]
            link.send(sig + payload)
            reply = bytearray(1 + size * len(self.ranks))
            link.recv_into(memoryview(reply))
            if reply[:1] != _OK:
                raise HFReduceError("local ranks called different collectives (or sizes or buffers) at once")
            return [bytes(reply[1 + i * size : 1 + (i + 1) * size]) for i in range(len(self.ranks))]
        got = {}
        payloads = [payload]
        for peer, link in sorted(self.links.items()):
            buf = bytearray(_SIGNATURE.size + size)
            link.recv_into(memoryview(buf))
            got[peer] = bytes(buf[: _SIGNATURE.size])
            payloads.append(bytes(buf[_SIGNATURE.size :]))
        ok = all(v == sig for v in got.values())
        answer = (_OK if ok else _MISMATCH) + b"".join(payloads)
        for link in self.links.values():
            link.send(answer)
        if not ok:
            raise HFReduceError(f"local ranks called different collectives at once: {got} vs {sig!r}")
        return payloads

    def send_to_leader(self, signature: int, payload: memoryview, result: memoryview) -> None:
        """A rank other than local rank 0: send ``payload`` to it, then fill ``result`` with its answer.

        Every local rank passes the same ``signature``; local rank 0 takes the payloads with ``gather`` and answers
        with ``answer``.

        Raises:
            HFReduceError: the local ranks passed different signatures (different collectives or sizes at once).
        """
        link = self.links[0]
        link.send_parts([_SIGNATURE.pack(signature & _MASK), payload])
        status = bytearray(1)
        link.recv_into(memoryview(status))
        if status != _OK:
            raise HFReduceError("local ranks called different collectives (or sizes) at once")
        link.recv_into(result)

    def gather(self, signature: int, into: list[memoryview]) -> None:
        """Local rank 0: receive every other local rank's payload (``send_to_leader``).

        Local rank ``i``'s goes into ``into[i - 1]``, which must be as long as that rank's payload.

        Raises:
            HFReduceError: a local rank passed another signature (it and every other are told so).
        """
        sig = _SIGNATURE.pack(signature & _MASK)
        got = bytearray(_SIGNATURE.size)
        for peer in range(1, len(self.ranks)):
            link = self.links[peer]
            link.recv_into(memoryview(got))
            if got != sig:
                for other in self.links.values():
                    other.send(_MISMATCH)
                raise HFReduceError(f"local ranks called different collectives at once: {bytes(got)!r} vs {sig!r}")
            link.recv_into(into[peer - 1])

    def answer(self, result: memoryview) -> None:
        """Local rank 0: send ``result`` to every other local rank, which ``send_to_leader`` waits for."""
        for link in self.links.values():
            link.send_parts([_OK, result])

    def exchange_fds(self, fds: list[int]) -> list[list[int]]:
        """Every local rank's ``fds`` (the same count everywhere), in local-rank order.

        The received fds are new descriptors owned by the caller; this rank's own row is ``fds`` itself.
        """
        count = len(fds)
        if len(self.ranks) == 1:
            return [fds]
        if self.local_rank != 0:
            link = self.links[0]
            self._send_fds(link, fds)
            flat = self._recv_fds(link, count * len(self.ranks))
            table = [flat[i * count : (i + 1) * count] for i in range(len(self.ranks))]
            for fd in table[self.local_rank]:
                os.close(fd)  # our own, received back: keep the original
            table[self.local_rank] = fds
            return table
        table = [fds] + [self._recv_fds(self.links[p], count) for p in range(1, len(self.ranks))]
        flat = [fd for row in table for fd in row]
        for peer in range(1, len(self.ranks)):
            self._send_fds(self.links[peer], flat)
        return table

    def _send_fds(self, link: Link, fds: list[int]) -> None:
        try:
            socket.send_fds(link.sock, [struct.pack("!I", len(fds))], fds)
        except OSError as exc:
            raise LinkError(link.peer, "closed", str(exc)) from exc

    def _recv_fds(self, link: Link, count: int) -> list[int]:
        try:
            _, fds, _, _ = socket.recv_fds(link.sock, 4, count)
        except OSError as exc:
            raise LinkError(link.peer, "closed", str(exc)) from exc
        if len(fds) != count:
            raise LinkError(link.peer, "closed", f"expected {count} fds, got {len(fds)}")
        return list(fds)

    def abort(self) -> None:
        """Fail every blocked send and receive on the node's links now (from any thread)."""
        for link in self.links.values():
            link.abort()

    def close(self) -> None:
        """Close this rank's links of the star (local rank 0: to every other; the others: to rank 0)."""
        for link in self.links.values():
            link.close()
