"""Where the cluster is and who the user is: ``~/.hfai/conf.json`` (``hfai init``), overridden by the environment.

The environment: the cluster's client variables ``FF_MGMTD_ADDRESSES`` and ``FF_TOKEN`` (what every tool reads,
and what the agent gives every task), or HAI's ``HFAI_MGMTD``, ``HFAI_TOKEN`` and ``HFAI_SERVER``. Without a
scheduler address the scheduler is found through mgmtd.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

SERVER_ENV, TOKEN_ENV, MGMTD_ENV, CONFIG_ENV = "HFAI_SERVER", "HFAI_TOKEN", "HFAI_MGMTD", "HFAI_CONFIG"
# The cluster's client variables (hf3fs, fireflyer, hfai alike); HAI's names above win when both are set.
FF_TOKEN_ENV, FF_MGMTD_ENV = "FF_TOKEN", "FF_MGMTD_ADDRESSES"


class ConfigError(Exception):
    """No server or token configured; the message says how to set them."""


@dataclass(frozen=True)
class HfaiConfig:
    """The cluster and the user's token, as ``load`` found them.

    Attributes:
        server: the scheduler's address; empty: found through mgmtd.
        token: the user's token.
        mgmtd: mgmtd addresses, comma-separated.
    """

    server: str = ""
    token: str = ""
    mgmtd: str = ""

    def require(self) -> HfaiConfig:
        """``self``, once it names a cluster (a scheduler or mgmtd) and a token.

        Raises:
            ConfigError: it does not; the message says how to set them.
        """
        if not (self.server or self.mgmtd) or not self.token:
            raise ConfigError(
                f"no cluster address or token: run `hfai init <token> --mgmtd host:port` "
                f"or set {FF_MGMTD_ENV} and {FF_TOKEN_ENV}"
            )
        return self

    def mgmtd_addresses(self) -> list[str]:
        """The mgmtd addresses as a list, blanks dropped."""
        return [a.strip() for a in self.mgmtd.split(",") if a.strip()]


def config_path(environ: Mapping[str, str]) -> Path:
    """Where ``hfai init`` saves the config: ``$HFAI_CONFIG``, else ``~/.hfai/conf.json``."""
    return Path(environ.get(CONFIG_ENV) or Path.home() / ".hfai" / "conf.json")


def _stored(path: Path) -> dict[str, str]:
    """The settings ``hfai init`` saved; ConfigError for a file it did not write so (empty, edited, cut short)."""
    try:
        parsed = json.loads(path.read_text() or "null")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not an hfai config ({exc}); run `hfai init` again or remove it") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        raise ConfigError(f"{path}: not an hfai config (a JSON object of strings); run `hfai init` again or remove it")
    return {str(k): v for k, v in parsed.items()}


def load(environ: Mapping[str, str] | None = None) -> HfaiConfig:
    """The config: each setting from the environment (HAI's names first, then FF_*), else from the saved file.

    Raises:
        ConfigError: the saved file is not one ``hfai init`` wrote (empty, edited, cut short).
    """
    env = os.environ if environ is None else environ
    stored: dict[str, str] = {}
    path = config_path(env)
    if path.exists():
        stored = _stored(path)
    return HfaiConfig(
        server=env.get(SERVER_ENV) or stored.get("server", ""),
        token=env.get(TOKEN_ENV) or env.get(FF_TOKEN_ENV) or stored.get("token", ""),
        mgmtd=env.get(MGMTD_ENV) or env.get(FF_MGMTD_ENV) or stored.get("mgmtd", ""),
    )


def save(config: HfaiConfig, environ: Mapping[str, str] | None = None) -> Path:
    """Writes ``config`` to ``config_path`` atomically, readable by the user only (it holds the token); the path."""
    path = config_path(os.environ if environ is None else environ)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(config), indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
