"""``bootstrap_admin_token_file``: mgmtd imports an admin token at start (the Helm chart's admin Secret).

Each test runs on SQLite and on PostgreSQL (``db_url``), with real mgmtd instances.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy.orm import Session

from ff_cluster import MgmtdClient
from ff_mgmtd.bootstrap import DESCRIPTION, BootstrapAdminError, import_admin_token
from ff_mgmtd.core import tokens
from ff_mgmtd.server import MIGRATIONS
from ff_mgmtd.store import identity
from ff_mgmtd.store.schema import VERSION_TABLE
from ff_rpc import RpcError
from ff_store import Store, open_store
from ff_testing.mgmtd import InProcessMgmtd
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb

StartMgmtd = Any


def _token_file(folder: Path, token: str | None = None) -> tuple[Path, str]:
    token = token or tokens.new_token().token
    path = folder / "admin-token"
    path.write_text(token + "\n")  # as a Secret's file might end
    return path, token


async def _whoami(mgmtd: InProcessMgmtd, token: str) -> common_pb2.Principal:
    client = MgmtdClient([mgmtd.address], token=token)
    try:
        resp: pb.WhoAmIResponse = await client.identity.who_am_i(pb.WhoAmIRequest())
        return resp.principal
    finally:
        await client.close()


async def _tokens_of(mgmtd: InProcessMgmtd, user: str) -> list[pb.TokenInfo]:
    client = mgmtd.client()
    try:
        return list((await client.identity.list_tokens(pb.ListTokensRequest(user_name=user))).tokens)
    finally:
        await client.close()


async def test_first_start_makes_the_admin_and_a_restart_changes_nothing(
    db_url: str, start_mgmtd: StartMgmtd, tmp_path: Path
) -> None:
    path, token = _token_file(tmp_path)
    first = await start_mgmtd(db_url, "m1", bootstrap_admin_token_file=path)
    me = await _whoami(first, token)
    assert (me.name, me.role) == ("admin", common_pb2.ROLE_ADMIN) and me.uid >= 1000
    [stored] = await _tokens_of(first, "admin")
    assert (stored.token_id, stored.description, stored.expires_at) == (token.split("_")[1], DESCRIPTION, 0)
    # The admin administers: it issues a token for a new user.
    admin = MgmtdClient([first.address], token=token)
    await admin.identity.create_user(pb.CreateUserRequest(name="alice"))
    issued = await admin.identity.issue_token(pb.IssueTokenRequest(user_name="alice"))
    await admin.close()
    assert (await _whoami(first, issued.token)).name == "alice"
    await first.shutdown()

    again = await start_mgmtd(db_url, "m1", bootstrap_admin_token_file=path)
    assert (await _whoami(again, token)).uid == me.uid
    assert [t.token_id for t in await _tokens_of(again, "admin")] == [stored.token_id]  # not imported twice


async def test_a_revoked_bootstrap_token_stays_revoked_across_restarts(
    db_url: str, start_mgmtd: StartMgmtd, tmp_path: Path
) -> None:
    path, token = _token_file(tmp_path)
    first = await start_mgmtd(db_url, "m1", bootstrap_admin_token_file=path)
    admin = first.client()
    await admin.identity.revoke_token(pb.RevokeTokenRequest(token_id=token.split("_")[1]))
    await admin.close()
    await first.shutdown()
    again = await start_mgmtd(db_url, "m1", bootstrap_admin_token_file=path)
    with pytest.raises(RpcError) as err:
        await _whoami(again, token)
    assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
    # A new token in the file (the operator's way out) is imported next to it.
    path, fresh = _token_file(tmp_path)
    await again.shutdown()
    third = await start_mgmtd(db_url, "m1", bootstrap_admin_token_file=path)
    assert (await _whoami(third, fresh)).name == "admin"
    assert [t.revoked for t in await _tokens_of(third, "admin")] == [True, False]


async def test_two_instances_starting_together_make_one_admin_and_one_token(
    db_url: str, start_mgmtd: StartMgmtd, tmp_path: Path
) -> None:
    path, token = _token_file(tmp_path)
    a, b = await asyncio.gather(
        start_mgmtd(db_url, "a", bootstrap_admin_token_file=path),
        start_mgmtd(db_url, "b", bootstrap_admin_token_file=path),
    )
    assert (await _whoami(a, token)).name == (await _whoami(b, token)).name == "admin"
    client = a.client()
    try:
        users = (await client.identity.list_users(pb.ListUsersRequest())).users
    finally:
        await client.close()
    assert [u.name for u in users] == ["admin"]
    assert len(await _tokens_of(a, "admin")) == 1


async def test_concurrent_imports_on_one_database_converge(db_url: str) -> None:
    """The store function alone, four at once from separate engines: every one succeeds, one row each."""
    new = tokens.new_token()
    stores = [open_store(db_url, MIGRATIONS, VERSION_TABLE) for _ in range(4)]

    def import_it(session: Session) -> identity.AdminImport:
        return identity.import_admin_token(session, "admin", new.token_id, new.secret_hash, "d", time.time())

    try:
        done = await asyncio.gather(*[store.arun(import_it) for store in stores])
        assert sum(d.user_created for d in done) == 1 and sum(d.token_created for d in done) == 1
        assert len({d.user.uid for d in done}) == 1
        assert await stores[0].arun(lambda s: len(identity.list_tokens(s, "admin"))) == 1
    finally:
        for store in stores:
            store.dispose()


async def test_an_existing_user_is_made_admin(db_url: str, start_mgmtd: StartMgmtd, tmp_path: Path) -> None:
    first = await start_mgmtd(db_url, "m1")
    client = first.client()
    ops = (await client.identity.create_user(pb.CreateUserRequest(name="ops"))).user
    await client.close()
    await first.shutdown()
    path, token = _token_file(tmp_path)
    again = await start_mgmtd(db_url, "m1", bootstrap_admin_token_file=path, bootstrap_admin_user="ops")
    me = await _whoami(again, token)
    assert (me.name, me.uid, me.role) == ("ops", ops.uid, common_pb2.ROLE_ADMIN)


async def test_a_missing_file_imports_nothing(db_url: str, start_mgmtd: StartMgmtd, tmp_path: Path) -> None:
    mgmtd = await start_mgmtd(db_url, "m1", bootstrap_admin_token_file=tmp_path / "absent")
    client = mgmtd.client()
    try:
        assert list((await client.identity.list_users(pb.ListUsersRequest())).users) == []
    finally:
        await client.close()


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """The database as mgmtd opens it (migrated), without an mgmtd."""
    opened = open_store(db_url, MIGRATIONS, VERSION_TABLE)
    yield opened
    opened.dispose()


@pytest.mark.parametrize(
    ("content", "user", "message"),
    [
        ("not-a-token", "admin", "holds no token of the form fft_"),
        ("fft_0123456789abcdef_short", "admin", "holds no token of the form fft_"),
        ("", "admin", "it holds 0 characters"),
        (None, "Admin!", "user name 'Admin!' must match"),
        (None, "cluster", "reserved for the cluster's services"),
    ],
)
async def test_a_bad_file_or_user_is_refused_and_changes_nothing(
    store: Store, tmp_path: Path, content: str | None, user: str, message: str
) -> None:
    path = tmp_path / "admin-token"
    path.write_text(tokens.new_token().token if content is None else content)
    with pytest.raises(BootstrapAdminError, match=re.escape(message)) as err:
        await import_admin_token(store, path, user)
    assert not content or content not in str(err.value)  # the file's content is never shown
    assert await store.arun(identity.list_users) == []


async def test_a_token_id_stored_with_another_secret_or_user_is_refused(store: Store, tmp_path: Path) -> None:
    path, token = _token_file(tmp_path)
    first = await import_admin_token(store, path, "admin")
    assert first is not None and first.user_created and first.token_created
    path.write_text(token[:-1] + ("A" if token[-1] != "A" else "B"))  # the same id, another secret
    with pytest.raises(BootstrapAdminError, match="already stored for another user or with another secret"):
        await import_admin_token(store, path, "admin")
    path.write_text(token)
    with pytest.raises(BootstrapAdminError, match="already stored for another user or with another secret"):
        await import_admin_token(store, path, "other")  # another user's: not moved, and no user "other" made
    assert [u.name for u in await store.arun(identity.list_users)] == ["admin"]
    again = await import_admin_token(store, path, "admin")
    assert again is not None and not (again.user_created or again.promoted or again.token_created)


async def test_a_bad_file_ends_the_process_as_a_configuration_error(
    db_url: str, spawn_mgmtd: Any, tmp_path: Path
) -> None:
    path = tmp_path / "admin-token"
    path.write_text("fft_not_a_token_at_all")
    proc = spawn_mgmtd(db_url, "m1", bootstrap_admin_token_file=str(path))
    assert await asyncio.to_thread(proc.proc.wait, 30) == 2
    log = proc.log.read_text()
    assert "bootstrap_admin_token_file" in log and "holds no token of the form" in log
    assert "fft_not_a_token_at_all" not in log
