"""Load one settings model from defaults, a TOML file, environment variables and command-line flags."""

from __future__ import annotations

import argparse
import json
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, SecretStr

MASK = "********"


class ConfigError(ValueError):
    """The configuration cannot be loaded: unknown keys, bad values, unreadable file."""


class SettingsModel(BaseModel):
    """Base of every service's settings: frozen, and unknown keys are errors (typos fail loudly)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


SettingsT = TypeVar("SettingsT", bound=SettingsModel)


def load_settings(
    model: type[SettingsT],
    *,
    env_prefix: str,
    environ: Mapping[str, str],
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SettingsT:
    """Build settings from the four layers, later ones winning: defaults < file < environment < flags.

    Args:
        model: the service's settings class.
        env_prefix: e.g. ``FF_MGMTD_``; ``FF_MGMTD_LEASE_DURATION_S`` sets ``lease_duration_s``. The
            variable ``<prefix>CONFIG`` names the config file when ``config_file`` is not given.
        environ: the process environment (passed in, so that only ``__main__`` reads ``os.environ``).
        config_file: a TOML file with top-level keys named as the fields.
        overrides: values from command-line flags; ``None`` values are ignored.

    Raises:
        ConfigError: an unknown key in any layer, or a value that does not validate.
    """
    fields = model.model_fields
    merged: dict[str, Any] = {}
    file_path = config_file or _config_file_from_env(env_prefix, environ)
    if file_path is not None:
        merged.update(_read_file(file_path, fields))
    merged.update(_read_env(env_prefix, environ, fields))
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = sorted(set(merged) - set(fields))
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
    try:
        return model.model_validate(merged)
    except pydantic.ValidationError as exc:
        problems = "; ".join(_describe_error(e["loc"], e["msg"]) for e in exc.errors())
        raise ConfigError(f"invalid {model.__name__}: {problems}") from exc


def _describe_error(loc: tuple[int | str, ...], msg: str) -> str:
    """``field: message``; model-level checks have no field."""
    where = ".".join(map(str, loc))
    return f"{where}: {msg}" if where else msg


def describe_settings(settings: BaseModel) -> dict[str, Any]:
    """The effective settings as plain data for the start-up log, with every secret masked."""
    out: dict[str, Any] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            out[name] = MASK if value.get_secret_value() else ""
        elif isinstance(value, Path):
            out[name] = str(value)
        elif isinstance(value, BaseModel):
            out[name] = describe_settings(value)
        else:
            out[name] = value
    return out


def add_settings_arguments(parser: argparse.ArgumentParser, model: type[SettingsModel]) -> None:
    """Add one ``--field-name`` flag per field (default None, so unset flags do not override)."""
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=f"setting_{name}", default=None, metavar="VALUE", help=field.description)


def overrides_from_args(args: argparse.Namespace, model: type[SettingsModel]) -> dict[str, Any]:
    """The flag layer: the fields whose flags were given, parsed like environment values."""
    raw = {name: getattr(args, f"setting_{name}", None) for name in model.model_fields}
    return {name: _parse_text(value, model.model_fields[name]) for name, value in raw.items() if value is not None}


def _config_file_from_env(env_prefix: str, environ: Mapping[str, str]) -> Path | None:
    value = environ.get(f"{env_prefix}CONFIG")
    return Path(value) if value else None


def _read_file(path: Path, fields: Mapping[str, Any]) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s): {', '.join(unknown)}")
    return data


def _read_env(env_prefix: str, environ: Mapping[str, str], fields: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(env_prefix) or key == f"{env_prefix}CONFIG":
            continue
        name = key[len(env_prefix) :].lower()
        if name not in fields:
            raise ConfigError(f"environment variable {key} names no setting")
        out[name] = _parse_text(value, fields[name])
    return out


def _parse_text(value: str, field: Any) -> Any:
    """Environment and flag values are text; lists and mappings are given as JSON."""
    origin = typing.get_origin(field.annotation)
    if origin in (list, dict, tuple, set) or field.annotation in (list, dict):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"expected JSON for a {field.annotation}: {value!r}") from exc
    return value
