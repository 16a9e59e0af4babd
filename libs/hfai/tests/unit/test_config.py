"""``hfai``'s saved settings: a file that is not what ``hfai init`` writes is a clear ConfigError, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from hfai import config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]", '{"token": 5}', "\udcff"])
def test_a_config_file_that_is_not_one_is_a_config_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "hfai.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(config.ConfigError, match="not an hfai config"):
        config.load({config.CONFIG_ENV: str(path)})


def test_a_saved_config_is_read(tmp_path: Path) -> None:
    path = tmp_path / "hfai.json"
    path.write_text('{"token": "t", "mgmtd": "127.0.0.1:1"}')
    loaded = config.load({config.CONFIG_ENV: str(path)})
    assert loaded.token == "t" and loaded.mgmtd == "127.0.0.1:1"


def test_telemetry_reports_nothing_but_does_not_fail_with_a_broken_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hfai import telemetry

    path = tmp_path / "hfai.json"
    path.write_text("")
    monkeypatch.setenv(config.CONFIG_ENV, str(path))
    telemetry.flush()  # (a reporter made earlier in this process goes)
    telemetry.report(step=1, loss=2.0)  # no exception: the step goes on
    reporter = telemetry._Process.reporter
    assert reporter is not None and reporter.pusher is None  # and nothing is sent
    telemetry.flush()


def test_config_file_and_environment(tmp_path: Path) -> None:
    env = {config.CONFIG_ENV: str(tmp_path / "conf.json")}
    with pytest.raises(config.ConfigError, match="hfai init"):
        config.load(env).require()
    config.save(config.HfaiConfig(server="h:1", token="t"), env)
    assert config.load(env) == config.HfaiConfig(server="h:1", token="t")
    assert config.load({**env, config.TOKEN_ENV: "other"}).token == "other"
    assert (tmp_path / "conf.json").stat().st_mode & 0o777 == 0o600
