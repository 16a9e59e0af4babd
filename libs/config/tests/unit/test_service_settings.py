"""The settings every service shares: required cluster token and mgmtd addresses, and subclass defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

from ff_config import ConfigError, MgmtdClientSettings, ServiceSettings, load_settings


class _Service(MgmtdClientSettings):
    grace_s: float = Field(3.0, ge=0, description="a service's own default")
    own_setting_s: float = Field(1.0, gt=0, description="a field of the service")


def _load(**env: str) -> _Service:
    return load_settings(_Service, env_prefix="FF_X_", environ={f"FF_X_{k.upper()}": v for k, v in env.items()})


def test_shared_fields_load_from_the_service_prefix() -> None:
    s = _load(cluster_token="t", mgmtd_addresses=" a:1, ,b:2 ", own_setting_s="2", instance_id="x-1")
    assert s.mgmtd_address_list() == ["a:1", "b:2"]
    assert (s.resolved_cluster_token(), s.instance_id, s.own_setting_s, s.grace_s) == ("t", "x-1", 2.0, 3.0)
    assert (s.listen_address, s.advertise_address, s.token_cache_ttl_s) == ("127.0.0.1:0", "", 5.0)


def test_the_token_file_wins_and_is_read_stripped(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("from-file\n")
    s = _load(cluster_token="inline", cluster_token_file=str(token), mgmtd_addresses="a:1")
    assert s.resolved_cluster_token() == "from-file"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"mgmtd_addresses": "a:1"}, "cluster_token or cluster_token_file is required"),
        ({"cluster_token": "t"}, "mgmtd_addresses: at least one address is required"),
        ({"cluster_token": "t", "mgmtd_addresses": " , "}, "mgmtd_addresses: at least one address is required"),
    ],
)
def test_missing_token_or_mgmtd_is_a_config_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(**env)


def test_a_service_without_mgmtd_addresses_refuses_the_setting() -> None:
    with pytest.raises(ConfigError, match="FF_X_MGMTD_ADDRESSES names no setting"):
        load_settings(ServiceSettings, env_prefix="FF_X_", environ={"FF_X_CLUSTER_TOKEN": "t",
                                                                    "FF_X_MGMTD_ADDRESSES": "a:1"})  # fmt: skip
