"""Layered, validated service configuration: defaults < file < environment < flags."""

from ff_config.loader import (
    ConfigError,
    SettingsModel,
    add_settings_arguments,
    describe_settings,
    load_settings,
    overrides_from_args,
)
from ff_config.service import MgmtdClientSettings, ServiceSettings

__all__ = [
    "ConfigError",
    "MgmtdClientSettings",
    "ServiceSettings",
    "SettingsModel",
    "add_settings_arguments",
    "describe_settings",
    "load_settings",
    "overrides_from_args",
]
