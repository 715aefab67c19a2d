"""What the watch remembers: its thresholds (`WatchConfig`), the events it sends
(`WatchEvent`) and its state between looks at one run (`WatchState`). Plain data, so the
state model (`AppState.watch`) holds it without importing the rules that fold it
(tui/state/watch.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tui.protocol.jsontypes import JSONObject
from tui.state.format import duration

__all__ = ["Mark", "WatchConfig", "WatchEvent", "WatchState"]

# What counted as progress at a step: ("shard", done, total), ("batch", n),
# ("step", step or None, metrics lines) or ("lines", line count).
Mark = tuple[str | int | None, ...]


@dataclass(frozen=True)
class WatchConfig:
    """Thresholds; ``[watch]`` in eagle3.toml overrides them (see tui/services/config.py)."""

    factor: float = 5.0  # × the median interval between progress steps
    stall_starting_s: float = 900.0  # floors per phase; 0 = never stalled in that phase
    stall_loading_s: float = 120.0
    stall_loaded_s: float = 900.0  # profiling, compiling, graph capture: quiet for minutes
    stall_serving_s: float = 0.0  # an idle server is not stalled
    stall_extracting_s: float = 120.0
    stall_training_s: float = 600.0  # training steps: minutes each on big models
    stall_evaluating_s: float = 900.0
    stall_saving_s: float = 1800.0  # a sharded checkpoint of a big model to network storage
    hang_s: float = 600.0
    idle_util: float = 5.0  # GPU utilisation (%) that counts as idle
    on_hang: str = "notify"  # "notify" | "kill" | "restart": enforced by the host's supervisor
    on_diverge: str = "notify"  # "notify" | "kill": a diverged run (remote/run/diverge.py), by the host
    on_idle: str = "notify"  # "notify" | "kill": GPUs held but idle, log and CPU quiet, for idle_s
    idle_s: float = 1800.0


    def floor(self, phase: str) -> float:
        return float(getattr(self, f"stall_{phase}_s", 0.0))

    @classmethod
    def from_mapping(cls, values: Any) -> WatchConfig:
        """From a config section object or dict with the same field names."""
        if values is None:
            return cls()
        get: Callable[[str, float], Any] = (
            values.get if isinstance(values, dict) else lambda k, d: getattr(values, k, d))
        kw: dict[str, Any] = {f: (float(get(f, d)) if isinstance(d, float) else str(get(f, d)))
                              for f in cls.__dataclass_fields__ for d in (getattr(cls, f),)}
        return cls(**kw)


@dataclass(frozen=True)
class WatchEvent:
    """Something the user should hear about; ``seq`` orders events of one watch."""

    seq: int
    # "diverged" | "failed" | "finished" | "killed" | "stalled" | "hung" | "resumed" | "restarting" | "gave up"
    kind: str
    run_id: str
    at: float
    message: str
    detail: JSONObject = field(default_factory=dict, hash=False)

    def to_json(self) -> JSONObject:
        return {"event": self.kind, "run_id": self.run_id, "time": self.at, "message": self.message,
                **self.detail}


@dataclass(frozen=True)
class WatchState:
    """What the watch remembers between looks at one run."""

    config: WatchConfig = field(default_factory=WatchConfig)
    run_id: str | None = None
    phase: str | None = None
    steps: tuple[float, ...] = ()  # times of progress steps in the current phase
    last_step_t: float | None = None
    last_step: str | None = None  # "shard 37/64", "batch 3/16", "log line 1234"
    mark: Mark = ()  # what counted as progress at the last step
    idle_since: float | None = None
    condition: str = "ok"  # "ok" | "stalled" | "hung" | "ending" | "ended"
    events: tuple[WatchEvent, ...] = ()
    seq: int = 0
    once: frozenset[str] = frozenset()
    seeded: bool = False  # the pace so far came from the host; the next look continues it
    idle_what: str | None = None  # "CPU" | "CPU or GPU": hung by the host's record of activity
    gpus_seen: bool = True  # the snapshot had GPUs to judge (else only the processes were)

    def stalled_for(self, now: float) -> float | None:
        return now - self.last_step_t if self.condition in ("stalled", "hung") and self.last_step_t else None

    def describe(self, now: float) -> str | None:
        """ "no progress for 14m (last: shard 37/64 at 03:12)" while stalled or hung."""
        if self.condition == "hung" and self.idle_what and self.idle_since is not None:
            return f"no {self.idle_what} activity for {duration(int(now - self.idle_since))} (after the load)"
        if self.condition not in ("stalled", "hung") or self.last_step_t is None:
            return None
        span = duration(int(now - self.last_step_t))
        clock = time.strftime("%H:%M", time.localtime(self.last_step_t))
        what = ("processes asleep and GPUs idle, " if self.gpus_seen else "processes asleep, ") \
            if self.condition == "hung" else ""
        return f"{what}no progress for {span} (last: {self.last_step or 'start'} at {clock})"
