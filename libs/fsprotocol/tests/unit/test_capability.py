"""Meta's IoCapability: made with the key from the cluster token, checked by storage for inode, mode and expiry."""

from __future__ import annotations

from ff_fsprotocol.capability import capability_key, check_capability, make_capability


def test_capability() -> None:
    key = capability_key("secret")
    cap = make_capability(key, 42, False, expires_at_ns=2000)
    assert check_capability(key, cap, 42, write=False, now_ns=1000) is None
    assert "read-only" in (check_capability(key, cap, 42, write=True, now_ns=1000) or "")
    assert "inode" in (check_capability(key, cap, 43, write=False, now_ns=1000) or "")
    assert "expired" in (check_capability(key, cap, 42, write=False, now_ns=3000) or "")
    assert "forged" in (check_capability(capability_key("other"), cap, 42, write=False, now_ns=1000) or "")
    forged = cap[:8] + b"\x01" + cap[9:]  # flip writable
    assert "forged" in (check_capability(key, forged, 42, write=True, now_ns=1000) or "")
    assert "missing" in (check_capability(key, b"", 42, write=False, now_ns=1000) or "")
