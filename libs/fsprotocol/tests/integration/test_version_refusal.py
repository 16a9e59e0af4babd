"""A client refuses a node of another data path version at the handshake, naming both versions, and sends it
nothing.

The node here is a stand-in for another release (this tree has only its own); it speaks the handshake over a
real TCP socket. The node's side of the refusal (a client of another version) is tested against the real
storage node in services/storage/tests/integration/test_data_calls.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ff_fsprotocol.datapath import DATA_PATH_VERSION, DataConnection, DataConnectionPool, DataRefused, encode_header


async def _node(version: int | None, heard: list[dict[str, object]], done: asyncio.Event) -> asyncio.Server:
    """A node that takes any token and names ``version`` (None: none, as a release before version 4).

    ``heard``: the client's hello, then what it sent after the answer until it closed; ``done`` is set then.
    """

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        size = int.from_bytes(await reader.readexactly(4), "big")
        heard.append(json.loads(await reader.readexactly(size)))
        answer: dict[str, object] = {"ok": True, "host": ""}
        if version is not None:
            answer["version"] = version
        writer.write(encode_header(answer))
        await writer.drain()
        heard.append({"after": (await reader.read()).decode()})  # whatever the client sends before it closes
        writer.close()
        await writer.wait_closed()
        done.set()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize(
    ("version", "named"),
    [(DATA_PATH_VERSION - 1, f"data path version {DATA_PATH_VERSION - 1}"), (None, "no version (an older release)")],
)
async def test_a_node_of_another_version_is_refused(version: int | None, named: str) -> None:
    heard: list[dict[str, object]] = []
    done = asyncio.Event()
    server = await _node(version, heard, done)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = DataConnectionPool("token", host="")
    try:
        with pytest.raises(DataRefused) as refused:
            await pool.call(address, "BatchWrite", b"request", "", [])
        assert refused.value.code == "FAILED_PRECONDITION"
        assert named in refused.value.message
        assert f"this end speaks version {DATA_PATH_VERSION}" in refused.value.message
        await asyncio.wait_for(done.wait(), 5)  # the node sees the connection end
        assert heard[0]["version"] == DATA_PATH_VERSION  # the client named its own
        assert heard[1] == {"after": ""}, "nothing but the handshake was sent"
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_a_node_of_the_same_version_is_served() -> None:
    heard: list[dict[str, object]] = []
    done = asyncio.Event()
    server = await _node(DATA_PATH_VERSION, heard, done)
    conn = DataConnection(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", "token")
    try:
        assert (await conn.handshake())["version"] == DATA_PATH_VERSION
        assert conn.peer["version"] == DATA_PATH_VERSION
    finally:
        conn.close()
        await asyncio.wait_for(done.wait(), 5)
        server.close()
        await server.wait_closed()
