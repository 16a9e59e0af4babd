"""The first admin from a token file (``bootstrap_admin_token_file``): how the Helm chart gives mgmtd its admin."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from ff_mgmtd.core import tokens, validation
from ff_mgmtd.core.errors import Conflict, InvalidRequest, InvalidToken
from ff_mgmtd.store import identity
from ff_mgmtd.store.identity import AdminImport
from ff_rpc.auth import CLUSTER_PRINCIPAL_NAME
from ff_store import Store

logger = logging.getLogger(__name__)

DESCRIPTION = "bootstrap admin token (bootstrap_admin_token_file)"


class BootstrapAdminError(Exception):
    """The bootstrap admin token file or user cannot be used: mgmtd does not start (no message holds the token)."""


async def import_admin_token(store: Store, path: Path, user_name: str) -> AdminImport | None:
    """Import the admin token in ``path`` for ``user_name`` (``store.identity.import_admin_token``), at start.

    Returns None, with a warning, when the file does not exist (nothing to import).

    Raises:
        BootstrapAdminError: the file cannot be read or holds no token of mgmtd's format, the user name is not
            valid, or the token's id is stored for another user or with another secret.
    """
    try:
        text = await asyncio.to_thread(path.read_text)
    except FileNotFoundError:
        logger.warning("bootstrap_admin_token_file %s does not exist: no admin token imported", path)
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise BootstrapAdminError(f"bootstrap_admin_token_file {path}: cannot read it ({err})") from None
    token = text.strip()
    try:
        token_id, secret_hash = tokens.parse_token(token)
    except InvalidToken:
        raise BootstrapAdminError(
            f"bootstrap_admin_token_file {path} holds no token of the form fft_<16 hex digits>_<43 of A-Z a-z 0-9 _ ->"
            f" (it holds {len(token)} characters)"
        ) from None
    try:
        validation.check_new_user_name(user_name, {CLUSTER_PRINCIPAL_NAME})
        done = await store.arun(
            lambda s: identity.import_admin_token(s, user_name, token_id, secret_hash, DESCRIPTION, time.time())
        )
    except (InvalidRequest, Conflict) as err:
        raise BootstrapAdminError(f"bootstrap_admin_token_file {path} for user {user_name!r}: {err}") from None
    _log(done, path)
    return done


def _log(done: AdminImport, path: Path) -> None:
    facts = {"user": done.user.name, "uid": done.user.uid, "token_id": done.token.token_id}
    if done.user_created or done.promoted or done.token_created:
        what = "created" if done.user_created else "made admin" if done.promoted else "already admin"
        token = "token imported" if done.token_created else "token already stored"
        logger.info("bootstrap admin from %s: user %s, %s", path, what, token, extra=facts)
    else:
        logger.info("bootstrap admin from %s: user and token already there", path, extra=facts)
    if done.user.disabled:
        logger.warning("bootstrap admin user %s is disabled: its token is refused until it is enabled", done.user.name)
    if done.token.revoked:
        logger.warning("bootstrap admin token %s is revoked: put a new token in %s", done.token.token_id, path)
