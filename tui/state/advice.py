"""The advisor: should the live run be killed now? Pure: no I/O, no Textual.

Two warnings, shown as the dashboard's banner:

- **stale** -- the live run was launched with an older patch version than the one
  applied on the host now (``pristine`` counts as older than every version), so it
  runs without the newer fix.
- **doomed** -- an earlier run with the *same* patch state failed with a root cause
  that appears only after the weights loaded. The live run runs the same code, so it
  will most likely spend the whole load and then fail the same way.

Past runs are condensed into ``RunSummary`` by ``summarize`` (from a run record and an
``inspect_log`` result); ``tui/services/ledger.py`` fetches them from the host.

Time estimates (all in seconds from launch; documented because the log gives no
absolute clock the client can trust -- vLLM's timestamps carry neither year nor zone):

- ``fail_seconds`` = ``ended_at - launched_at`` for a run that exited by itself after
  a recognised failure: a fatal error ends the process within seconds. A run that was
  killed (it may have hung after the error for any time) gets None.
- ``load_seconds`` = the load duration the log itself reports ("Model loading took
  ... S seconds", else "Loading weights took S seconds", else the completed shard
  bar's elapsed time). It leaves out the startup before loading began (seconds to a
  minute), so it slightly underestimates -- the safe side for "saves ~N min". When the
  log reports none of these but shows where loading ended, and the whole log was
  read, the position of that line in the log is used: ``(ended_at - launched_at) *
  loaded_at_line / lines`` -- rough, since lines do not arrive at an even pace.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tui.protocol.records import RunRecord

__all__ = ["Advice", "RunSummary", "advise", "format_minutes", "patch_key", "summarize"]

PRISTINE = "pristine"
_NOT_A_STATE = frozenset({"unknown", "missing", "error"})
TITLE_KEEP = 60  # characters of a failure title shown in the banner

# Labels of inspect_log's timeline (tui/state/loganalysis/fold.py `_milestone_label`).
_MODEL_LOADED = re.compile(r"^Model loaded: \S+ GiB in ([\d.]+) s$")
_WEIGHTS_LOADED = re.compile(r"^Weights loaded in ([\d.]+) s$")


@dataclass(frozen=True)
class RunSummary:
    """What one past run tells about runs with the same patch state."""

    run_id: str
    patch_state: str | None  # "v4", "pristine", "unknown", … ; None when not recorded
    outcome: str  # "finished" | "failed" (a specific root cause, even if killed) | "killed" | "running" | "lost"
    failure_id: str | None = None  # the root cause's signature id
    failure_title: str | None = None
    failed_after_load: bool = False
    load_seconds: float | None = None  # launch → weights loaded (see module docstring)
    fail_seconds: float | None = None  # launch → failure (see module docstring)
    patch_set: str | None = None
    launched_at: float | None = None


@dataclass(frozen=True)
class Advice:
    """One banner line: why the live run should be killed, and what killing saves."""

    level: str  # "stale" | "doomed"
    title: str
    text: str  # one line
    saves_seconds: float | None = None
    like_run: str | None = None  # the earlier run whose failure this one will repeat


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def patch_key(patch_state: Any) -> tuple[str | None, str | None]:
    """(set, key) of a run's recorded patch state; key is the version ("v4") or state."""
    if not isinstance(patch_state, Mapping):
        return None, None
    pset = patch_state.get("set") if isinstance(patch_state.get("set"), str) else None
    version = patch_state.get("version")
    if isinstance(version, str) and version:
        return pset, version
    state = patch_state.get("state")
    return pset, state if isinstance(state, str) and state else None


def format_minutes(seconds: float) -> str:
    """A rounded duration for a banner: "<1 min", "14 min", "1 h 05 min"."""
    minutes = round(max(seconds, 0.0) / 60.0)
    if minutes < 1:
        return "<1 min"
    if minutes < 90:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _short(title: str | None) -> str:
    title = " ".join((title or "unknown failure").split())
    return title if len(title) <= TITLE_KEEP else title[: TITLE_KEEP - 1].rstrip() + "…"


# ---------------------------------------------------------------- summaries


def _outcome(record: RunRecord, root: Any) -> str:
    state = record.state
    if state == "running":
        return "running"
    if state == "killed" and (root is None or root.get("id") == "python-traceback"):
        return "killed"  # the traceback of the signal we sent (KeyboardInterrupt), not a failure
    if root is not None:
        return "failed"
    if state == "exited":
        code = record.exit_code
        if code == 0:
            return "finished"
        # the user's Ctrl-C or a SIGTERM (exit 130/143, or the signal itself): not a failure
        return "killed" if code in (130, 143) or record.signal in ("SIGINT", "SIGTERM") else "failed"
    return state or "unknown"


def _load_seconds(result: Mapping[str, Any], span: float | None, whole: bool) -> float | None:
    for entry in result.get("timeline") or ():
        m = _MODEL_LOADED.match(str(entry.get("label", "")))
        if m:
            return float(m.group(1))
    for entry in result.get("timeline") or ():
        m = _WEIGHTS_LOADED.match(str(entry.get("label", "")))
        if m:
            return float(m.group(1))
    shards = result.get("shards")
    if isinstance(shards, Mapping) and shards.get("total") and shards.get("done") == shards.get("total"):
        elapsed = _num(shards.get("elapsed_s"))
        if elapsed is not None:
            return elapsed
    loaded_at, lines = result.get("loaded_at_line"), result.get("lines")
    if whole and span is not None and isinstance(loaded_at, int) and isinstance(lines, int) and lines > 0:
        return span * min(loaded_at, lines) / lines
    return None


def _after_load(root: Mapping[str, Any], loaded_at: Any) -> bool:
    """The signature says so; failing that, the failure line comes after the loaded line."""
    flag = root.get("after_load")
    if isinstance(flag, bool):
        return flag
    line_no = root.get("line_no")
    return isinstance(loaded_at, int) and isinstance(line_no, int) and line_no > loaded_at


def summarize(run_record: RunRecord, inspect_result: Mapping[str, Any],
              whole: bool = True) -> RunSummary:
    """Condense a run record and the ``inspect_log`` result of its log.

    ``whole`` is False when only the log's tail was analysed: line numbers are then
    relative to the tail, so the position-based load estimate is not used.
    """
    pset, key = patch_key(run_record.patch_state)
    root = inspect_result.get("root_cause")
    root = root if isinstance(root, Mapping) else None
    launched = run_record.launched_at
    ended = run_record.ended_at
    span = ended - launched if launched is not None and ended is not None and ended >= launched else None
    outcome = _outcome(run_record, root)
    fail_s = span if root is not None and run_record.state == "exited" else None
    return RunSummary(
        run_id=run_record.run_id,
        patch_state=key,
        outcome=outcome,
        failure_id=str(root["id"]) if root is not None and root.get("id") else None,
        failure_title=str(root["title"]) if root is not None and root.get("title") else None,
        failed_after_load=root is not None and _after_load(root, inspect_result.get("loaded_at_line")),
        load_seconds=_load_seconds(inspect_result, span, whole),
        fail_seconds=fail_s,
        patch_set=pset,
        launched_at=launched,
    )


# ---------------------------------------------------------------- advice


def _rank(key: str | None, version_order: list[str]) -> int | None:
    """Position in the set's history: pristine -1, v1 0, …; None when not comparable."""
    if key == PRISTINE:
        return -1
    if key in version_order:
        return version_order.index(key)
    return None


def _elapsed(live_run: Any, now: float) -> float | None:
    launched = _num(getattr(live_run, "launched_at", None))
    return max(now - launched, 0.0) if launched is not None else None


def _remaining_load(live_analysis: Any, others: list[RunSummary], elapsed: float | None) -> float | None:
    """Loading still ahead of the live run: its bar's ETA, else earlier runs' median load."""
    phase = getattr(live_analysis, "phase", None)
    if phase not in (None, "starting", "loading"):
        return None
    shard = getattr(live_analysis, "shard", None)
    eta = _num(getattr(shard, "remaining_s", None))
    if phase == "loading" and eta is not None:
        return eta
    loads = [s.load_seconds for s in others if s.load_seconds is not None]
    if not loads or elapsed is None:
        return None
    left = statistics.median(loads) - elapsed
    return left if left > 0 else None


def _evidence(key: str, pset: str | None, others: list[RunSummary]) -> RunSummary | None:
    """The most recent earlier run with this patch state that failed after loading."""
    hits = [s for s in others
            if s.patch_state == key and (pset is None or s.patch_set in (None, pset))
            and s.outcome == "failed" and s.failed_after_load]
    if not hits:
        return None
    # newest first; a run with a known failure time beats one without
    hits.sort(key=lambda s: (s.fail_seconds is not None, s.launched_at or 0.0, s.run_id), reverse=True)
    return hits[0]


def advise(live_run: Any, live_analysis: Any, summaries: Mapping[str, RunSummary] | Iterable[RunSummary],
           applied_patch: str | None, version_order: list[str], now: float,
           patch_set: str | None = None) -> Advice | None:
    """Advice for the live run (a ``tui.protocol.records.RunRecord``), or None when all is well.

    ``live_analysis`` is its ``LogAnalysis`` (or None); ``summaries`` are past runs
    (the live run itself is ignored among them); ``applied_patch`` is the patch state
    on the host now ("v5", "pristine", or None when unknown); ``version_order`` the
    set's version names, oldest first; ``patch_set`` the configured set's name (a run
    launched with another set is not compared). Stale wins over doomed; when both
    hold, the stale advice names the earlier failure too.
    """
    if live_run is None or getattr(live_run, "state", None) != "running":
        return None
    run_id = getattr(live_run, "run_id", "?")
    pset, key = patch_key(getattr(live_run, "patch_state", None))
    if key is None or (patch_set is not None and pset is not None and pset != patch_set):
        return None
    items = summaries.values() if isinstance(summaries, Mapping) else summaries
    others = [s for s in items if s.run_id != run_id]
    elapsed = _elapsed(live_run, now)
    already_failed = getattr(live_analysis, "root_cause", None) is not None
    # "unknown" (hand edits), "missing", "error" say nothing about which code ran
    like = None if already_failed or key in _NOT_A_STATE else _evidence(key, pset, others)

    live_rank, applied_rank = _rank(key, version_order), _rank(applied_patch, version_order)
    if live_rank is not None and applied_rank is not None and live_rank < applied_rank:
        saves = _remaining_load(live_analysis, others, elapsed)
        tail = f" (saves ~{format_minutes(saves)} of loading)" if saves else ""
        also = (f" Run {like.run_id} with {key} failed after loading ({_short(like.failure_title)})."
                if like is not None else "")
        return Advice(
            level="stale",
            title=f"Run {run_id} is stale: launched with {key}, {applied_patch} applied now",
            text=(f"Run {run_id} was launched with {key}; {applied_patch} is applied now — it will "
                  f"not pick up the fix. Kill now and relaunch{tail}.{also}"),
            saves_seconds=saves,
            like_run=like.run_id if like is not None else None,
        )

    if like is None:
        return None
    what = _short(like.failure_title)
    title = f"Run {run_id} ({key}) will likely fail like run {like.run_id}"
    if like.fail_seconds is None or elapsed is None:
        text = (f"Run {run_id} ({key}) likely fails like run {like.run_id} after loading ({what}); "
                f"kill now.")
        return Advice("doomed", title, text, None, like.run_id)
    left = like.fail_seconds - elapsed
    if left > 0:
        text = (f"Run {run_id} ({key}) likely fails like run {like.run_id} after loading ({what}); "
                f"kill now saves ~{format_minutes(left)}.")
        return Advice("doomed", title, text, left, like.run_id)
    text = (f"Run {run_id} ({key}) is past the point where run {like.run_id} failed after loading "
            f"({what}, at {format_minutes(like.fail_seconds)}); it may still fail the same way.")
    return Advice("doomed", title, text, 0.0, like.run_id)
