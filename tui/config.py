"""`eagle3.toml`: the user's configuration, parsed strictly with tomllib.

Unknown keys and wrong types are errors that name the key, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tui.state.watch import WatchConfig  # [watch]: stall and hang thresholds (issue 15)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_NAME = "eagle3.toml"


# Allowed ranges of number settings (the agent refuses snapshot intervals outside these).
RANGES = {"interval": (0.05, 3600.0), "connect_timeout": (0.1, 3600.0), "keepalive": (0.0, 3600.0)}


class ConfigError(ValueError):
    """A malformed config file; the message is one line naming the file and key."""


@dataclass(frozen=True)
class HostConfig:
    target: str | None = None
    python: str = "python3"
    runs_dir: str | None = None  # on the host; default ~/.cache/eagle3-tui/runs
    interval: float = 1.0  # seconds between snapshots
    connect_timeout: float = 10.0
    keepalive: float = 15.0


@dataclass(frozen=True)
class RunConfig:
    name: str = "run"
    command: tuple[str, ...] = ()
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    match: str | None = None
    log: str | None = None
    graces: tuple[float, float] = (10.0, 10.0)  # SIGINT -> SIGTERM -> SIGKILL waits
    gpu_wait: float = 30.0


@dataclass(frozen=True)
class PatchesConfig:
    set: str | None = None


@dataclass(frozen=True)
class NotifyConfig:
    command: tuple[str, ...] = ()  # argv run with each event as one JSON object on stdin


@dataclass(frozen=True)
class Config:
    host: HostConfig = field(default_factory=HostConfig)
    run: RunConfig = field(default_factory=RunConfig)
    patches: PatchesConfig = field(default_factory=PatchesConfig)
    path: Path | None = None
    watch: WatchConfig = field(default_factory=WatchConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)


def _check(section: str, key: str, value: Any, kind: Any, where: str) -> Any:
    """Validate one value against the dataclass field's annotated type."""
    name = f"[{section}] {key}"
    if kind in ("str", "str | None"):
        if value is None and kind == "str | None":
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {name} must be a string, not {type(value).__name__}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}: {name} must be a number")
        low, high = RANGES.get(key, (0.0, math.inf))
        if not low <= value <= high:
            raise ConfigError(f"{where}: {name} must be between {low:g} and {high:g}")
        return float(value)
    if kind == "tuple[str, ...]":
        if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
            raise ConfigError(f"{where}: {name} must be a list of strings (an argv, not a shell line)")
        return tuple(value)
    if kind == "tuple[float, float]":
        ok = isinstance(value, list) and len(value) == 2
        ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value)
        if not ok:
            raise ConfigError(f"{where}: {name} must be two non-negative numbers [sigint_s, sigterm_s]")
        return (float(value[0]), float(value[1]))
    if kind == "dict[str, str]":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f"{where}: {name} must be a table of strings")
        return dict(value)
    raise AssertionError(kind)  # a field type this parser does not know


def _section(cls: type, section: str, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [{section}] must be a table")
    known = {f.name: f.type for f in fields(cls)}
    values = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key [{section}] {key} (known: {', '.join(known)})")
        values[key] = _check(section, key, value, known[key], where)
    return cls(**values)


def parse_config(text: str, where: str = DEFAULT_NAME) -> Config:
    """Parse config text; raises ConfigError with one line naming the problem."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    sections = {"host": HostConfig, "run": RunConfig, "patches": PatchesConfig, "watch": WatchConfig,
                "notify": NotifyConfig}
    for key in raw:
        if key not in sections:
            raise ConfigError(f"{where}: unknown section [{key}] (known: {', '.join(sections)})")
    return Config(
        **{name: _section(cls, name, raw.get(name, {}), where) for name, cls in sections.items()}
    )


def load_config(path: str | Path | None) -> Config:
    """Load `path`, or ./eagle3.toml when it exists, or the defaults."""
    explicit = path is not None
    p = Path(path) if path is not None else Path.cwd() / DEFAULT_NAME
    if not p.exists():
        if explicit:
            raise ConfigError(f"{p}: config file not found")
        return Config()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config: {exc}") from None
    cfg = parse_config(text, str(p))
    return replace(cfg, path=p)
