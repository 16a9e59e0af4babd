"""Bearer token format and hashing.

A token is ``fft_<token id>_<secret>``. The id names the row; only SHA-256 of the secret is stored.
The secret is 32 random bytes, so a fast hash is enough: there is nothing to brute-force that a slow
password hash would protect (unlike human-chosen passwords).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from ff_mgmtd.core.errors import InvalidToken

PREFIX = "fft"
_TOKEN_RE = re.compile(r"^fft_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class NewToken:
    """A token just made: the full ``token`` is shown to its owner once; only ``secret_hash`` is stored."""

    token_id: str
    secret_hash: str
    token: str


def new_token() -> NewToken:
    """A fresh token with a random id and a 32-byte random secret."""
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return NewToken(token_id, _hash_secret(secret), f"{PREFIX}_{token_id}_{secret}")


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_token(token: str) -> tuple[str, str]:
    """Split a token into (token id, secret hash); InvalidToken when it is not of our format."""
    match = _TOKEN_RE.match(token)
    if match is None:
        raise InvalidToken("malformed token")
    return match.group(1), _hash_secret(match.group(2))


def secret_matches(stored_hash: str, presented_hash: str) -> bool:
    """Compare two secret hashes in constant time (no timing hint of how much of a guess was right)."""
    return hmac.compare_digest(stored_hash, presented_hash)
