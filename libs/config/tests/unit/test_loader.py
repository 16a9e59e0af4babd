from __future__ import annotations

import argparse
from pathlib import Path

import pydantic
import pytest
from pydantic import Field, SecretStr

from ff_config import (
    ConfigError,
    SettingsModel,
    add_settings_arguments,
    describe_settings,
    load_settings,
    overrides_from_args,
)


class DemoSettings(SettingsModel):
    listen_address: str = "127.0.0.1:0"
    lease_duration_s: float = Field(10.0, gt=0)
    num_workers: int = 2
    peers: list[str] = []
    api_token: SecretStr = SecretStr("")
    state_dir: Path = Path("state")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    return path


def test_defaults_when_nothing_is_given() -> None:
    s = load_settings(DemoSettings, env_prefix="FF_DEMO_", environ={})
    assert s.lease_duration_s == 10.0
    assert s.num_workers == 2


def test_layers_override_in_order_defaults_file_env_flags(tmp_path: Path) -> None:
    cfg = write(tmp_path, 'lease_duration_s = 3.0\nnum_workers = 4\nlisten_address = "0.0.0.0:1"\n')
    env = {"FF_DEMO_NUM_WORKERS": "8", "FF_DEMO_LISTEN_ADDRESS": "10.0.0.1:2", "OTHER": "x"}
    s = load_settings(
        DemoSettings, env_prefix="FF_DEMO_", environ=env, config_file=cfg, overrides={"listen_address": "h:3"}
    )
    assert s.lease_duration_s == 3.0  # file beats default
    assert s.num_workers == 8  # env beats file
    assert s.listen_address == "h:3"  # flag beats env


def test_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    cfg = write(tmp_path, "num_workers = 5\n")
    s = load_settings(DemoSettings, env_prefix="FF_DEMO_", environ={"FF_DEMO_CONFIG": str(cfg)})
    assert s.num_workers == 5


def test_lists_from_env_are_json() -> None:
    s = load_settings(DemoSettings, env_prefix="FF_DEMO_", environ={"FF_DEMO_PEERS": '["a:1", "b:2"]'})
    assert s.peers == ["a:1", "b:2"]


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"FF_DEMO_LEASE_DURATIN_S": "1"}, "FF_DEMO_LEASE_DURATIN_S names no setting"),
        ({"FF_DEMO_LEASE_DURATION_S": "-1"}, "lease_duration_s"),
        ({"FF_DEMO_NUM_WORKERS": "many"}, "num_workers"),
        ({"FF_DEMO_PEERS": "a:1"}, "expected JSON"),
    ],
)
def test_bad_environment_values_are_clear_errors(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(DemoSettings, env_prefix="FF_DEMO_", environ=environ)


def test_unknown_key_in_file_is_an_error(tmp_path: Path) -> None:
    cfg = write(tmp_path, "nmu_workers = 3\n")
    with pytest.raises(ConfigError, match=r"unknown setting.*nmu_workers"):
        load_settings(DemoSettings, env_prefix="FF_DEMO_", environ={}, config_file=cfg)


def test_bad_toml_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(DemoSettings, env_prefix="FF_DEMO_", environ={}, config_file=write(tmp_path, "x = = 1"))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(DemoSettings, env_prefix="FF_DEMO_", environ={}, config_file=tmp_path / "nope.toml")


def test_flags_are_generated_from_fields_and_only_given_flags_override() -> None:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, DemoSettings)
    args = parser.parse_args(["--num-workers", "7", "--peers", '["x:1"]'])
    overrides = overrides_from_args(args, DemoSettings)
    assert overrides == {"num_workers": "7", "peers": ["x:1"]}
    s = load_settings(DemoSettings, env_prefix="FF_DEMO_", environ={"FF_DEMO_NUM_WORKERS": "3"}, overrides=overrides)
    assert s.num_workers == 7


def test_describe_masks_secrets_and_keeps_the_rest() -> None:
    s = load_settings(DemoSettings, env_prefix="FF_DEMO_", environ={"FF_DEMO_API_TOKEN": "hunter2"})
    described = describe_settings(s)
    assert described["api_token"] == "********"
    assert "hunter2" not in repr(described)
    assert described["state_dir"] == "state"
    assert s.api_token.get_secret_value() == "hunter2"


def test_settings_are_frozen() -> None:
    s = load_settings(DemoSettings, env_prefix="FF_DEMO_", environ={})
    with pytest.raises(Exception, match="frozen"):
        s.num_workers = 3  # type: ignore[misc]


class PairSettings(SettingsModel):
    low: int = 1
    high: int = 2

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> PairSettings:
        if self.low > self.high:
            raise ValueError("low must not exceed high")
        return self


def test_model_level_checks_read_cleanly() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(PairSettings, env_prefix="FF_P_", environ={"FF_P_LOW": "5"})
    assert str(err.value) == "invalid PairSettings: Value error, low must not exceed high"
