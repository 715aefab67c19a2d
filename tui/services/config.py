"""`eagle3.toml`: the user's configuration, validated by pydantic against typed dataclasses.

A wrong value is an error of one line naming the file and the key
(`eagle3.toml: run.command: must be a list of strings, not str`), so a typo in a value
never silently falls back to a default. An unknown key is a warning naming the closest
known key: the config still loads, and every command prints the warning once.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, make_dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, Strict, TypeAdapter, ValidationError

from tui.state.watch import WatchConfig  # [watch]: stall and hang thresholds (issue 15)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_NAME = "eagle3.toml"
INIT_HINT = "eagle3-tui init writes a commented one"


class ConfigError(ValueError):
    """A malformed config file; the message is one line naming the file and key."""


# Value types: strict (no "3" for 3, no true for 1), finite numbers, no empty strings.
Text = Annotated[str, Strict(), Field(min_length=1)]
Argv = tuple[Annotated[str, Strict()], ...]


SLURM_KEYS = ("partition", "gpus", "time", "sbatch_args", "node_agent")  # [run] keys that only sbatch uses
SLURM_TIME = r"^([0-9]+(-[0-9]+)?(:[0-9]+){0,2}|UNLIMITED|INFINITE)$"  # sbatch --time
# Allowed ranges of the number settings, in seconds (the agent refuses intervals outside).
RANGES = {"interval": (0.05, 3600.0), "connect_timeout": (0.1, 3600.0), "keepalive": (0.0, 3600.0),
          "graces": (0.0, 3600.0), "gpu_wait": (0.0, 3600.0), "restart_delay": (0.0, 86400.0),
          "restart_delay_max": (0.0, 86400.0), "thrash_window": (0.0, 604800.0)}


def Seconds(key: str) -> Any:  # noqa: N802 - builds a type
    low, high = RANGES[key]
    return Annotated[float, Strict(), Field(ge=low, le=high, allow_inf_nan=False)]


def _key(default: Any = None, what: str = "a string", **kw: Any) -> Any:
    """A dataclass field whose error messages say what it must be."""
    if "default_factory" in kw:
        return field(metadata={"what": what}, **kw)
    return field(default=default, metadata={"what": what}, **kw)


STRICT = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class HostConfig:
    __pydantic_config__ = STRICT
    target: Text | None = _key(None)
    python: Text | None = _key(None)  # None: find python3.X >= 3.9 on the host
    runs_dir: Text | None = _key(None)  # on the host; default ~/.cache/eagle3-tui/runs
    interval: Seconds("interval") = _key(1.0, "a number of seconds")  # type: ignore[valid-type]  # between snapshots
    connect_timeout: Seconds("connect_timeout") = _key(10.0, "a number of seconds")  # type: ignore[valid-type]
    keepalive: Seconds("keepalive") = _key(15.0, "a number of seconds")  # type: ignore[valid-type]


@dataclass(frozen=True)
class RunConfig:
    __pydantic_config__ = STRICT
    name: Text = _key("run")
    command: Argv = _key((), "a list of strings (an argv, not a shell line)")
    cwd: Text = _key(".")
    env: dict[str, Annotated[str, Strict()]] = _key(what="a table of strings",
                                                     default_factory=dict)
    match: Text | None = _key(None)
    log: Text | None = _key(None)
    graces: tuple[Seconds("graces"), Seconds("graces")] = _key(  # type: ignore[valid-type]
        (10.0, 10.0), "two numbers of seconds [after SIGINT, after SIGTERM]")
    gpu_wait: Seconds("gpu_wait") = _key(30.0, "a number of seconds")  # type: ignore[valid-type]
    # "slurm": launch submits a batch job with sbatch; kill is scancel (docs/architecture.md)
    scheduler: Literal["local", "slurm"] = _key("local", '"local" or "slurm"')
    partition: Text | None = _key(None)  # the keys below are sbatch's, used with slurm only
    gpus: Annotated[int, Strict(), Field(ge=0)] | None = _key(None, "a whole number >= 0")
    time: Annotated[str, Strict(), Field(pattern=SLURM_TIME)] | None = _key(
        None, 'a Slurm time limit ("30", "2:00:00", "1-12")')
    sbatch_args: Argv = _key((), "a list of strings (extra sbatch arguments)")
    # the agent on a running job's node: a step inside the job (srun --overlap), ssh to
    # the node, or none (the login node's GPUs and processes stay on screen)
    node_agent: Literal["srun", "ssh", "off"] = _key("srun", '"srun", "ssh" or "off"')
    # Restarts, decided on the host by the supervisor (remote/run/restart.py, README "Runs that
    # keep going"): the n-th restart waits min(restart_delay × 2^(n-1), restart_delay_max).
    restart: Literal["never", "on-failure"] = _key("never", '"never" or "on-failure"')
    max_restarts: Annotated[int, Strict(), Field(ge=0, le=1000)] = _key(
        3, "a whole number from 0 to 1000")
    restart_delay: Seconds("restart_delay") = _key(30.0, "a number of seconds")  # type: ignore[valid-type]
    restart_delay_max: Seconds("restart_delay_max") = _key(600.0, "a number of seconds")  # type: ignore[valid-type]
    # the thrash guard: this many failures within thrash_window seconds → give up (0: off)
    thrash_failures: Annotated[int, Strict(), Field(ge=0, le=1000)] = _key(
        4, "a whole number from 0 to 1000 (0: no thrash guard)")
    thrash_window: Seconds("thrash_window") = _key(600.0, "a number of seconds")  # type: ignore[valid-type]


@dataclass(frozen=True)
class PatchesConfig:
    __pydantic_config__ = STRICT
    set: Text | None = _key(None)


@dataclass(frozen=True)
class NotifyConfig:
    __pydantic_config__ = STRICT
    # argv run with each event as one JSON object on stdin
    command: Argv = _key((), "a list of strings (an argv, not a shell line)")


# [watch] fills the pure layer's own dataclass (tui/state/watch.py); validated through a
# twin whose every field is a finite number >= 0.
_WatchSection = make_dataclass(
    "WatchSection",
    [(f.name, Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)],
      field(default=f.default, metadata={"what": "a number >= 0"})) for f in fields(WatchConfig)
     if f.name not in ("on_hang", "on_diverge", "on_idle")]
    # what the supervisor on the host does to a hung run (remote/run/restart.py)
    + [("on_hang", Literal["notify", "kill", "restart"],
        field(default="notify", metadata={"what": '"notify", "kill" or "restart"'}))]
    # … to a diverged run, and to one whose GPUs sit idle (a diverged run is never restarted)
    + [(k, Literal["notify", "kill"], field(default="notify", metadata={"what": '"notify" or "kill"'}))
       for k in ("on_diverge", "on_idle")],
    frozen=True, namespace={"__pydantic_config__": STRICT})
@dataclass(frozen=True)
class FleetConfig:
    """Many hosts: `hosts = ["a", "b"]` at the top of the file, or `[fleet] hosts`."""

    __pydantic_config__ = STRICT
    hosts: tuple[Text, ...] = _key((), "a list of targets")
    hosts_file: Text | None = _key(None)  # one target per line (# comments); relative to eagle3.toml
    connect_limit: Annotated[int, Strict(), Field(ge=1, le=1024)] = _key(
        16, "a whole number from 1 to 1024 (connections in flight at once)")
    # seconds between each host's snapshots on the fleet screen; None: by the fleet's size
    interval: Seconds("interval") | None = _key(None, "a number of seconds")  # type: ignore[valid-type]


SECTIONS: dict[str, type] = {"host": HostConfig, "run": RunConfig, "patches": PatchesConfig,
                             "watch": _WatchSection, "notify": NotifyConfig, "fleet": FleetConfig}


@dataclass(frozen=True)
class Config:
    host: HostConfig = field(default_factory=HostConfig)
    run: RunConfig = field(default_factory=RunConfig)
    patches: PatchesConfig = field(default_factory=PatchesConfig)
    path: Path | None = None
    looked_for: Path | None = None  # no file was found: the ./eagle3.toml that was looked for
    watch: WatchConfig = field(default_factory=WatchConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    warnings: tuple[str, ...] = ()  # unknown keys, each with the closest known one

    @property
    def where(self) -> str:
        return str(self.path) if self.path else DEFAULT_NAME

    def require_command(self) -> tuple[str, ...]:
        """`[run] command`, or the ConfigError that launching without one deserves."""
        if not self.run.command and self.looked_for is not None:
            raise ConfigError(f"no config file: {self.looked_for} not found, and launching needs its "
                              f"[run] command ({INIT_HINT})")
        if not self.run.command:
            raise ConfigError(f"{self.where}: run.command: required (a list of strings)")
        return self.run.command

    @property
    def source(self) -> str:
        """Which file the settings came from, for a message: its path, "no config file at
        PATH" when none was found, or "the config" for one built in memory."""
        if self.path is not None:
            return str(self.path)
        if self.looked_for is not None:
            return f"no config file at {self.looked_for}"
        return "the config"

    def lacks_command(self) -> str:
        """Why there is nothing to launch, naming the file read or the one looked for."""
        if self.looked_for is not None:
            return f"no config file at {self.looked_for} ({INIT_HINT})"
        return f"no [run] command in {self.source}"


_ADAPTERS: dict[str, TypeAdapter[Any]] = {name: TypeAdapter(cls) for name, cls in SECTIONS.items()}


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def shown_key(key: str) -> str:
    """A key of the user's file as a warning may show it: a bare key as it is, any other
    quoted as TOML writes it, its controls escaped (``"na\\u001bme"``): the file's text
    never reaches the terminal raw."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _unknown(kind: str, section: str | None, key: str, known: list[str]) -> str:
    name = f"{section}.{key}" if section is not None else key
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
    shown = f"{section}.{shown_key(key)}" if section is not None else f"[{shown_key(key)}]"
    return f"unknown {kind} {shown} ignored ({hint})"


def _message(section: str, cls: type, err: Mapping[str, Any]) -> str:
    """One ValidationError entry as `section.key: what is wrong`."""
    key = str(err["loc"][0]) if err["loc"] else "?"
    what = next((f.metadata.get("what", "valid") for f in fields(cls) if f.name == key), "valid")
    kind = err["type"]
    if kind == "missing" and len(err["loc"]) == 1:
        text = f"required ({what})"
    elif kind == "string_too_short":
        text = "must not be empty"
    elif kind in ("greater_than_equal", "less_than_equal") and key in RANGES:
        text = "must be between {:g} and {:g}".format(*RANGES[key])
    elif kind in ("greater_than_equal", "less_than_equal"):
        text = f"must be {what}"
    elif kind in ("string_pattern_mismatch", "literal_error"):
        text = f"must be {what}, not {err.get('input')!r}"
    else:
        given = type(err.get("input")).__name__
        text = f"must be {what}" + (f", not {given}" if len(err["loc"]) == 1 else "")
    return f"{section}.{key}: {text}"


def parse_config(text: str, where: str = DEFAULT_NAME) -> Config:
    """Parse config text; raises ConfigError with one line naming the problem."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib reads nested arrays and tables recursively
        raise ConfigError(f"{where}: not valid TOML: arrays or tables nested too deeply") from None
    warnings: list[str] = []
    sections: dict[str, Any] = {}
    if "hosts" in raw:  # `hosts = [...]` before any table: the fleet's targets
        hosts = raw.pop("hosts")
        if not isinstance(hosts, list):
            raise ConfigError(f"{where}: hosts: must be a list of targets (hosts = [\"a\", \"b\"])")
        fleet = raw.setdefault("fleet", {})
        if isinstance(fleet, dict):
            more = fleet.get("hosts", [])
            if not isinstance(more, list):  # a string would be spread into one-letter hosts
                raise ConfigError(f"{where}: fleet.hosts: must be a list of targets (hosts = [\"a\", \"b\"])")
            fleet["hosts"] = [*hosts, *more]
    for name, value in raw.items():
        if name not in SECTIONS:
            warnings.append(f"{where}: " + _unknown("section", None, name, [f"[{s}]" for s in SECTIONS]))
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {name}: must be a table ([{name}])")
        known = [f.name for f in fields(SECTIONS[name])]
        for key in value:
            if key not in known:
                warnings.append(f"{where}: " + _unknown("key", name, key, [f"{name}.{k}" for k in known]))
        clean = {k: v for k, v in value.items() if k in known}
        try:
            sections[name] = _ADAPTERS[name].validate_python(clean)
            if name == "watch":
                sections[name] = WatchConfig(**asdict(sections[name]))
        except ValidationError as exc:
            raise ConfigError(f"{where}: " + _message(name, SECTIONS[name], exc.errors()[0])) from None
    run = sections.get("run")
    if run is not None and run.restart_delay_max < run.restart_delay:
        raise ConfigError(f"{where}: run.restart_delay_max: must be at least run.restart_delay"
                          f" ({run.restart_delay:g})")
    if run is not None and run.scheduler != "slurm":
        unused = [k for k in SLURM_KEYS if k in raw.get("run", {})]
        if unused:
            warnings.append(f"{where}: run.{', run.'.join(unused)} ignored: only used with "
                            'scheduler = "slurm"')
    return Config(**sections, warnings=tuple(warnings))


def load_config(path: str | Path | None) -> Config:
    """Load `path`, or ./eagle3.toml when it exists, or the defaults."""
    explicit = path is not None
    p = Path(path) if path is not None else Path.cwd() / DEFAULT_NAME
    if not p.exists():
        if explicit:
            raise ConfigError(f"{p}: config file not found ({INIT_HINT}: eagle3-tui --config {p} init)")
        return Config(looked_for=p)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config: {exc}") from None
    cfg = parse_config(text, str(p))
    return replace(cfg, path=p)
