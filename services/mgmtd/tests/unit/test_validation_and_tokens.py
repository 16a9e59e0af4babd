from __future__ import annotations

import pytest

from ff_mgmtd.core import tokens, validation
from ff_mgmtd.core.errors import InvalidRequest, InvalidToken, NotPrimary
from ff_mgmtd.core.model import Chain, ChainTable, ChainTarget, Endpoint, NodeType

GRPC = (Endpoint(name="grpc", address="127.0.0.1:9000"),)


def test_valid_registration() -> None:
    reg = validation.check_registration(0, 3, "host-1", GRPC, {"zone": "a"})
    assert reg.node_type is NodeType.STORAGE
    assert reg.endpoints == GRPC


@pytest.mark.parametrize(
    ("node_type", "hostname", "endpoints", "tags", "message"),
    [
        (0, "h", GRPC, {}, "node_type 0"),
        (99, "h", GRPC, {}, "node_type 99"),
        (3, "", GRPC, {}, "hostname"),
        (3, "bad host", GRPC, {}, "hostname"),
        (3, "h", (), {}, "at least one endpoint"),
        (3, "h", (Endpoint(name="grpc", address="nohost"),), {}, "not host:port"),
        (3, "h", (Endpoint(name="grpc", address="h:70000"),), {}, "not host:port"),
        (3, "h", GRPC * 2, {}, "unique"),
        (3, "h", GRPC, {"": "x"}, "tags"),
    ],
)
def test_bad_registrations(
    node_type: int, hostname: str, endpoints: tuple[Endpoint, ...], tags: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        validation.check_registration(0, node_type, hostname, endpoints, tags)


def chain(chain_id: int, *target_ids: int, version: int = 0) -> Chain:
    return Chain(
        chain_id=chain_id, version=version, targets=tuple(ChainTarget(target_id=t, node_id=1) for t in target_ids)
    )


@pytest.mark.parametrize(
    ("chains", "message"),
    [
        ([], "at least one chain"),
        ([chain(0, 1)], "chain_id 0"),
        ([chain(1, 1), chain(1, 2)], "given twice"),
        ([chain(1)], "at least one target"),
        ([chain(1, 1, 1)], "more than one place"),
        ([chain(1, 1), chain(2, 1)], "more than one place"),
        ([chain(1, 0)], "target_id must be in 1.."),
        ([chain(1, 2**63)], "target_id must be in 1.."),
    ],
)
def test_bad_chains(chains: list[Chain], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        validation.check_chains(chains)


def test_bad_chain_tables() -> None:
    with pytest.raises(InvalidRequest, match="table_id"):
        validation.check_chain_table(ChainTable(table_id=0, version=0, chain_ids=(1,)))
    with pytest.raises(InvalidRequest, match="at least one chain"):
        validation.check_chain_table(ChainTable(table_id=1, version=0, chain_ids=()))
    with pytest.raises(InvalidRequest, match="once"):
        validation.check_chain_table(ChainTable(table_id=1, version=0, chain_ids=(1, 1)))


def test_config_must_be_toml() -> None:
    assert validation.check_config('a = 1\n[b]\nc = "x"\n').startswith("a = 1")
    with pytest.raises(InvalidRequest, match="TOML"):
        validation.check_config("a = = 1")


@pytest.mark.parametrize("name", ["alice", "bob_2", "x.y-z"])
def test_good_names(name: str) -> None:
    assert validation.check_name("user", name) == name


@pytest.mark.parametrize("name", ["", "Alice", "a/b", "a\0b", "1abc", "x" * 65, "a b"])
def test_bad_names(name: str) -> None:
    with pytest.raises(InvalidRequest, match="user name"):
        validation.check_name("user", name)


def test_a_new_user_cannot_take_a_reserved_name() -> None:
    assert validation.check_new_user_name("alice", {"cluster"}) == "alice"
    with pytest.raises(InvalidRequest, match="reserved"):
        validation.check_new_user_name("cluster", {"cluster"})
    with pytest.raises(InvalidRequest, match="user name"):
        validation.check_new_user_name("Bad Name", {"cluster"})


def test_tokens_round_trip_and_only_the_hash_is_kept() -> None:
    new = tokens.new_token()
    token_id, presented_hash = tokens.parse_token(new.token)
    assert token_id == new.token_id
    assert tokens.secret_matches(new.secret_hash, presented_hash)
    assert new.token.split("_", 2)[2] not in new.secret_hash
    other = tokens.new_token()
    assert not tokens.secret_matches(other.secret_hash, presented_hash)


@pytest.mark.parametrize("bad", ["", "fft_", "fft_zz_abc", "Bearer x", "fft_0123456789abcdef_short"])
def test_malformed_tokens(bad: str) -> None:
    with pytest.raises(InvalidToken, match="malformed"):
        tokens.parse_token(bad)


def test_not_primary_carries_the_primary_address() -> None:
    err = NotPrimary("10.0.0.1:9000")
    assert dict(err.trailing_metadata()) == {"ff-not-primary": "1", "ff-primary-address": "10.0.0.1:9000"}
    assert dict(NotPrimary("").trailing_metadata()) == {"ff-not-primary": "1"}


@pytest.mark.parametrize("ttl", [float("nan"), float("inf"), -1.0])
def test_bad_token_lifetimes(ttl: float) -> None:
    with pytest.raises(InvalidRequest, match="ttl_s"):
        validation.check_ttl(ttl)


def test_token_lifetimes() -> None:
    assert validation.check_ttl(0.0) == 0.0
    assert validation.check_ttl(3600.0) == 3600.0


@pytest.mark.parametrize("text", ["a\0b", "line\nbreak", "x" * 257])
def test_bad_descriptions(text: str) -> None:
    with pytest.raises(InvalidRequest, match="description"):
        validation.check_description(text)


def test_names_must_be_unique() -> None:
    assert validation.check_names("group", ["a", "b"]) == ["a", "b"]
    with pytest.raises(InvalidRequest, match="once"):
        validation.check_names("group", ["a", "a"])
