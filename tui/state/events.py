"""Every event the reducer accepts, as one closed union: `Event`.

`tui.state.reducer.apply(state, event, now)` takes an `Event` and nothing else; its
dispatch ends in `assert_never`, so a new event type that no branch handles is a type
error (mypy), not a silent no-op. Two families make it up:

- `AgentEvent` (tui/protocol/stream.py): what the agent's stream carries — the agent's
  messages (hello, snapshot, log bytes, log reset, kill progress, error) and the
  link's status.
- `ClientEvent` (this module): what the client itself knows — the config as (re)read,
  the user's cursor and filter, actions started and ended, the ledger as read, which
  log the screen follows, and the pacing of that log's analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tui.protocol.stream import AgentEvent
from tui.state.advice import RunSummary
from tui.state.model import ActionResult, Settings

ANALYSE_SLICE = 400  # lines per AnalyseLog (~15 ms of loganalysis.fold.step on one core)


@dataclass(frozen=True)
class ConfigRead:
    """eagle3.toml as (re)read: its settings, or `settings.error` when it is broken."""

    settings: Settings


@dataclass(frozen=True)
class CursorMoved:
    """The user put the Runs table's cursor on a run (None: back to the rule's choice)."""

    run_id: str | None


@dataclass(frozen=True)
class ShowAll:
    """`a`: every run on the host (on), or only this config's (off)."""

    on: bool


@dataclass(frozen=True)
class ActionStarted:
    """A kill, launch, relaunch or patch push was sent, under its own id."""

    action_id: str
    kind: str  # kill | launch | relaunch | push
    run_id: str | None = None


@dataclass(frozen=True)
class ActionUnconfirmed:
    """The link dropped between the request and its reply: the outcome is asked for
    again after the reconnect."""

    action_id: str
    error: str


@dataclass(frozen=True)
class ActionEnded:
    """An action's outcome: the agent's result, or the error."""

    action_id: str
    ok: bool
    result: ActionResult | None = None
    error: str | None = None
    confirmed_after_reconnect: bool = False


@dataclass(frozen=True)
class LedgerRead:
    """Past runs' summaries (by run id) and the host's applied patch, as (re)read."""

    summaries: dict[str, RunSummary] = field(default_factory=dict)
    applied_patch: str | None = None
    version_order: tuple[str, ...] = ()


@dataclass(frozen=True)
class LogFollowed:
    """The screen now follows `path` through subscription `sub` (None: no log; `note` says why).
    `defer`: the follower drains the log's analysis backlog (`AnalyseLog`)."""

    path: str | None
    sub: str | None
    note: str | None = None
    defer: bool = False
    older: bool = False  # a LogOlder will bring the lines before the subscription's start


@dataclass(frozen=True)
class AnalyseLog:
    """Fold the next `lines` of the followed log's backlog into its analysis. A feed with
    `defer` sends these one at a time until the backlog is empty, so a big chunk (the
    first tail of a long log, a burst) never holds the screen's loop for long."""

    sub: str | None
    lines: int = 0  # 0: ANALYSE_SLICE


@dataclass(frozen=True)
class TailSize:
    """The subscription `sub` started on a file of `size` bytes (its reply): once the
    stream reaches that offset, the first tail is all there and can be drawn at once."""

    sub: str
    size: int


@dataclass(frozen=True)
class LogOlder:
    """The bytes before the subscription's first tail (fetched after the first frame),
    ending where the tail starts; `cut`: they start mid-line. Empty: there are none."""

    sub: str
    data: bytes
    cut: bool = False


@dataclass(frozen=True)
class Notice:
    """A line to tell the user once."""

    severity: str  # information | warning | error
    text: str


ClientEvent = (ConfigRead | CursorMoved | ShowAll | ActionStarted | ActionUnconfirmed | ActionEnded
               | LedgerRead | LogFollowed | AnalyseLog | TailSize | LogOlder | Notice)

# Everything `tui.state.reducer.apply` accepts.
Event = AgentEvent | ClientEvent

__all__ = [
    "ANALYSE_SLICE",
    "ActionEnded",
    "ActionStarted",
    "ActionUnconfirmed",
    "AgentEvent",
    "AnalyseLog",
    "ClientEvent",
    "ConfigRead",
    "CursorMoved",
    "Event",
    "LedgerRead",
    "LogFollowed",
    "LogOlder",
    "Notice",
    "ShowAll",
    "TailSize",
]
