"""Where the scheduler is and who the user is: ``~/.hfai/conf.json`` (``hfai init``), overridden by
``HFAI_SERVER``, ``HFAI_TOKEN`` and ``HFAI_MGMTD`` (the agent sets them for tasks)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

SERVER_ENV, TOKEN_ENV, MGMTD_ENV, CONFIG_ENV = "HFAI_SERVER", "HFAI_TOKEN", "HFAI_MGMTD", "HFAI_CONFIG"


class ConfigError(Exception):
    """No server or token configured; the message says how to set them."""


@dataclass(frozen=True)
class HfaiConfig:
    server: str = ""
    token: str = ""
    mgmtd: str = ""

    def require(self) -> HfaiConfig:
        if not self.server or not self.token:
            raise ConfigError(
                f"no scheduler address or token: run `hfai init <token> --server host:port` "
                f"or set {SERVER_ENV} and {TOKEN_ENV}"
            )
        return self


def config_path(environ: Mapping[str, str]) -> Path:
    return Path(environ.get(CONFIG_ENV) or Path.home() / ".hfai" / "conf.json")


def load(environ: Mapping[str, str] | None = None) -> HfaiConfig:
    env = os.environ if environ is None else environ
    stored: dict[str, str] = {}
    path = config_path(env)
    if path.exists():
        stored = json.loads(path.read_text())
    return HfaiConfig(
        server=env.get(SERVER_ENV) or stored.get("server", ""),
        token=env.get(TOKEN_ENV) or stored.get("token", ""),
        mgmtd=env.get(MGMTD_ENV) or stored.get("mgmtd", ""),
    )


def save(config: HfaiConfig, environ: Mapping[str, str] | None = None) -> Path:
    path = config_path(os.environ if environ is None else environ)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(config), indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
