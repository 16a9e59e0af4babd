"""The alert config: a versioned TOML file of rules and webhooks (``default_rules.toml`` is the default).

```toml
version = 3              # raised by whoever edits the file; every alert records the version that raised it
interval_s = 15          # how often the rules are evaluated

[[rules]]
name = "target-not-serving"
kind = "target_not_serving"
severity = "critical"    # or "warning"
for_s = 120              # the condition must hold this long before the alert fires

[[webhooks]]
url = "http://hooks.example/alerts"
```

Kinds and their parameters: ``node_lost`` (a node mgmtd declared dead; ``node_types``: which, default all),
``target_not_serving``, ``chain_not_serving`` (no target of the chain serving), ``task_no_progress``
(a running task whose ``hfai_step`` did not grow for ``window_s``), ``validator_failed`` (a node's last
validation failed), ``storage_near_full`` (a storage target's used share above ``threshold``), ``loss_nan``
(a rank's last ``hfai_loss`` is NaN or infinite), ``loss_exploding`` (a rank's last ``hfai_loss`` above
``factor`` times its lowest over ``window_s``).
"""

from __future__ import annotations

import tomllib
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_CONFIG = Path(__file__).with_name("default_rules.toml")


class AlertConfigError(ValueError):
    """The alert config cannot be used; the message names the file and the field."""


class RuleKind(StrEnum):
    """What a rule checks (each kind reads its own facts: see ``engine.RULE_SOURCES``)."""

    NODE_LOST = "node_lost"
    TARGET_NOT_SERVING = "target_not_serving"
    CHAIN_NOT_SERVING = "chain_not_serving"
    TASK_NO_PROGRESS = "task_no_progress"
    VALIDATOR_FAILED = "validator_failed"
    STORAGE_NEAR_FULL = "storage_near_full"
    LOSS_NAN = "loss_nan"
    LOSS_EXPLODING = "loss_exploding"


class Severity(StrEnum):
    """How urgent an alert is; passed on to receivers as is."""

    CRITICAL = "critical"
    WARNING = "warning"


class Rule(BaseModel):
    """One alert rule: a kind with its thresholds; ``for_s``: how long a condition holds before it fires."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=100, pattern=r"^[a-zA-Z0-9_.-]+$")
    kind: RuleKind
    severity: Severity = Severity.WARNING
    for_s: float = Field(0.0, ge=0)
    window_s: float = Field(600.0, gt=0)
    threshold: float = Field(0.9, gt=0, le=1)
    factor: float = Field(10.0, gt=1)
    node_types: tuple[str, ...] = ()


class Webhook(BaseModel):
    """A receiver of alert changes, with its deadline and retry budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(pattern=r"^https?://")
    timeout_s: float = Field(5.0, gt=0)
    max_attempts: int = Field(5, ge=1, le=100)


class AlertConfig(BaseModel):
    """The alert config as loaded: version, evaluation interval (seconds), rules and webhooks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1)
    interval_s: float = Field(15.0, gt=0)
    rules: tuple[Rule, ...] = ()
    webhooks: tuple[Webhook, ...] = ()

    @model_validator(mode="after")
    def _unique_names(self) -> AlertConfig:
        names = [r.name for r in self.rules]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"rule names must be unique: {repeated}")
        return self


def load_config(path: Path = DEFAULT_CONFIG) -> AlertConfig:
    """Read and check an alert config.

    Raises:
        AlertConfigError: the file is missing, not TOML, or a field is wrong (named in the message).
    """
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise AlertConfigError(f"alert config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise AlertConfigError(f"alert config {path}: not TOML: {exc}") from None
    try:
        return AlertConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise AlertConfigError(f"alert config {path}: {problems}") from None
