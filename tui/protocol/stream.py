"""What the client's event stream carries: the agent's messages and the link's status.

`AgentClient.events()` (tui/transport) yields `AgentEvent`s; the reducer
(tui/state/reducer.py) folds them, with the client's own events (tui/state/events.py),
into the state. `LinkStatus` lives here, below both, so the reducer recognises it by its
type without importing the transport.
"""

from __future__ import annotations

from dataclasses import dataclass

from tui.protocol import AgentError, Hello, KillProgress, LogData, LogReset, Snapshot


@dataclass(frozen=True)
class LinkStatus:
    """The link's state, as an event: connecting | connected | reconnecting | failed | closed."""

    state: str
    attempt: int = 0
    error: str | None = None
    since: float = 0.0  # time.time() when the link was last known good (0: never)


# Everything `AgentClient.events()` yields: results go to the waiting request instead.
AgentEvent = Hello | Snapshot | LogData | LogReset | KillProgress | AgentError | LinkStatus
