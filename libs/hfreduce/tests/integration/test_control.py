"""The control server on real sockets: who is blamed, and rank 0 not leaving before the others know."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from hfreduce.control import ControlClient, ControlServer, Message

TIMEOUT_S = 3.0


@pytest.fixture
def group() -> Iterator[tuple[ControlServer, list[ControlClient]]]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = ControlServer(port=port, world_size=3, timeout_s=TIMEOUT_S, listener=listener)
    server.start()
    clients = [ControlClient("127.0.0.1", port, TIMEOUT_S) for _ in range(3)]
    hellos = [
        threading.Thread(target=c.rendezvous, args=({"rank": r, "world_size": 3, "node_rank": r, "local_rank": 0},))
        for r, c in enumerate(clients)
    ]
    for t in hellos:
        t.start()
    for t in hellos:
        t.join()
    yield server, clients
    for c in clients:
        c.close()
    server.stop()


def blame(client: ControlClient, rank: int, suspect: int, kind: str = "closed") -> Message:
    return client.request({"type": "blame", "rank": rank, "seq": 1, "suspect": suspect, "kind": kind}, TIMEOUT_S)


def test_rank_zero_waits_until_every_survivor_has_its_answer(group: tuple[ControlServer, list[ControlClient]]) -> None:
    server, clients = group
    clients[2].close()  # rank 2 dies mid-collective
    assert blame(clients[0], 0, suspect=2)["rank"] == 2
    # rank 1 has not asked yet: were rank 0 to exit now, rank 1 would find no server and blame rank 0
    started = time.monotonic()
    assert not server.wait_settled(culprit=2, timeout_s=0.3)
    assert time.monotonic() - started >= 0.3
    answers: list[Message] = []
    asker = threading.Thread(target=lambda: answers.append(blame(clients[1], 1, suspect=0)))
    asker.start()
    assert server.wait_settled(culprit=2, timeout_s=TIMEOUT_S)
    asker.join()
    assert answers[0]["rank"] == 2  # the rank that died, not the rank whose links closed after it


def test_a_hung_culprit_is_not_waited_for(group: tuple[ControlServer, list[ControlClient]]) -> None:
    server, clients = group
    for rank, client in enumerate(clients):
        client.notify({"type": "enter", "rank": rank, "seq": 1, "op": "allreduce"})
    # rank 2 hangs in the collective (stays connected, never asks); ranks 0 and 1 time out on it and ask
    for rank in (0, 1):
        assert blame(clients[rank], rank, suspect=2, kind="timeout")["rank"] == 2
    started = time.monotonic()
    assert server.wait_settled(culprit=2, timeout_s=TIMEOUT_S)
    assert time.monotonic() - started < 1.0
