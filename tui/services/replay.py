"""Replay: a recorded run (its run dir, copied from a host or in a local runs dir) played
through the dashboard as the live link would feed it — post-mortems, demos, fixtures.

`load` reads the run dir: the run record (``manifest.json``, else ``launch.json``, with
``exit.json`` / ``killed.json``), the timeline (``timeline.jsonl``, parsed as host text
by `tui.services.timeline`) and the log (``output.log``). `ReplayClient` has the agent
client's interface: a `Hello`, then `Snapshot`s (the run's state and its cards' last
sample) and `LogData` for every subscription, all from the recording; `read_range`
serves the log and the timeline so far (the `t` screen); every other op is refused (a
replay changes nothing). Nothing of the recording is trusted: the log reaches the
screen through the reducer and the widgets' sanitizer like a live log, the record and
the timeline through `hosttext.clean_tree`.

Time: recorded seconds since the launch are played at ``speed`` on the wall clock,
from ``start_s``. The run's timestamps are moved onto this clock (the launch is
``start_s / speed`` seconds before the replay began), so what the client measures
itself (durations, the history ETA: ``expected_load_s`` is divided by ``speed`` too)
runs at the replay's pace, while what the log prints (rates, the bars' ETAs) is the
recorded figure. The log is played in step with the timeline: each sample since the
recorder kept it says how many log bytes pace had read by then (``o``); between two,
and for a timeline without them, the bytes come evenly, whole lines at a time.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from tui import protocol as p
from tui.protocol import hostjson
from tui.protocol.hosttext import clean, clean_tree
from tui.services import timeline
from tui.transport import AgentApi, AgentRequestError

TICK_S = 0.1  # wall seconds between steps of the replay
SNAPSHOT_S = 1.0  # wall seconds between snapshots (the agent's default interval)
LOG_FILE = "output.log"
LOG_MAX = 64 * 1024 * 1024  # a bigger log is played from its last 64 MiB
RECORD_MAX = 4 * 1024 * 1024  # bytes of a run record (manifest, exit, killed): its argv and env at most


class ReplayError(Exception):
    """The run dir cannot be replayed; ``str()`` is the one line to print."""


@dataclass
class Recording:
    run_dir: Path
    record: dict[str, Any]  # the run record as `runs` would list it (cleaned host text)
    tl: timeline.Timeline
    raw_lines: list[tuple[float, bytes]]  # (seconds since the launch, the timeline's line)
    log: bytes
    log_path: str
    shift: float  # seconds from the launch to the timeline's t0
    end: float  # seconds since the launch of the last thing recorded
    exit: dict[str, Any] | None  # the timeline's exit event, if the run ended
    offsets: list[tuple[float, int]] = field(default_factory=list)  # (seconds, log bytes) known
    dropped: int = 0  # absurd numbers of the run record, left out (``tl.bad_lines``: the timeline's)

    def log_at(self, rel: float) -> int:
        """Log bytes played at ``rel`` seconds since the launch: linear between known
        points, cut back to a whole line."""
        pts = self.offsets
        i = bisect.bisect_right([t for t, _ in pts], rel)
        if i >= len(pts):
            return len(self.log)
        (t0, o0), (t1, o1) = pts[max(i - 1, 0)], pts[i]
        n = o0 if t1 <= t0 else int(o0 + (o1 - o0) * min(1.0, max(0.0, (rel - t0) / (t1 - t0))))
        return self.log.rfind(b"\n", 0, n) + 1 if n < len(self.log) else n


def _json(path: Path, dropped: list[int] | None = None) -> Any:
    """A record file's JSON with its absurd numbers (not finite, or beyond
    ``hostjson.NUMBER_MAX``) None, counted in ``dropped``; None for a file that is
    missing, too big, too deep or not JSON."""
    try:
        with path.open("rb") as f:
            data = f.read(RECORD_MAX + 1)
        obj, bad = hostjson.checked(hostjson.loads(data, RECORD_MAX))
    except (OSError, ValueError):
        return None
    if dropped is not None:
        dropped.append(bad)
    return obj


def load(run_dir: Path) -> Recording:
    """The recording in ``run_dir``; `ReplayError` (one line) when it is not one."""
    where = clean(str(run_dir), newline=False)
    if not run_dir.is_dir():
        raise ReplayError(f"no run dir {where}")
    try:
        data = (run_dir / timeline.TIMELINE_FILE).read_bytes()
    except OSError:
        raise ReplayError(f"{where} has no readable {timeline.TIMELINE_FILE}: only runs launched by "
                          "eagle3-tui's shim keep one (not adopted runs, nor older ones)") from None
    tl = timeline.parse(data)
    t0 = tl.t0
    if t0 is None or not tl.lines:
        raise ReplayError(f"{where}/{timeline.TIMELINE_FILE} is not a run's timeline "
                          f"({len(tl.lines)} readable line(s), {'a' if t0 else 'no'} header)")
    dropped: list[int] = []
    rec = _json(run_dir / "manifest.json", dropped)
    rec = rec if isinstance(rec, dict) else _json(run_dir / "launch.json", dropped)
    if not isinstance(rec, dict):
        raise ReplayError(f"{where} holds no run record (manifest.json or launch.json)")
    rec = clean_tree(rec)
    launched = hostjson.number(tl.header.get("launched_at")) or t0  # the header's sane fields only
    shift = t0 - launched
    # the lines the timeline kept (an absurd number, a torn or foreign line: none of them)
    raw = [(ln["t"] + shift, line) for ln, line in zip(tl.lines, tl.raw)]
    exits = [ln for ln in tl.lines if ln.get("e") == "exit"]
    end = tl.lines[-1]["t"] + shift
    log_file = run_dir / LOG_FILE
    try:
        with log_file.open("rb") as f:
            f.seek(max(0, log_file.stat().st_size - LOG_MAX))
            log = f.read(LOG_MAX)
    except OSError:
        log = b""
    offsets = [(0.0, 0)]
    for ln in tl.lines:  # pace's offsets; a truncated log (smaller offset) starts nothing new
        o = ln.get("o")
        if isinstance(o, int) and not isinstance(o, bool) and o >= offsets[-1][1]:
            offsets.append((ln["t"] + shift, min(o, len(log))))
    offsets.append((max(end, offsets[-1][0]), len(log)))
    killed = _json(run_dir / "killed.json", dropped)
    ended = _json(run_dir / "exit.json", dropped)
    # the log under the host's path, as the live dashboard showed it; its bytes are the copy's
    log_path = rec["log"] if isinstance(rec.get("log"), str) and rec["log"] else str(log_file)
    record = dict(rec, run_id=str(rec.get("run_id") or tl.header.get("run") or run_dir.name),
                  log=log_path, external=False)
    record["exit_info"] = {"state": "killed" if isinstance(killed, dict) else "exited",
                           "exit_code": (ended or {}).get("exit_code") if isinstance(ended, dict)
                           else exits[-1].get("code") if exits else None,
                           "signal": (ended or {}).get("signal") if isinstance(ended, dict)
                           else exits[-1].get("signal") if exits else None}
    return Recording(run_dir, record, tl, raw, log, log_path, shift, end,
                     exits[-1] if exits else None, offsets, sum(dropped))


class ReplayClient(AgentApi):
    """The agent's wire (and so its typed API) over a `Recording`, played at ``speed`` from
    ``start_s`` seconds after the launch (``speed`` 0: held there, for tests)."""

    def __init__(self, rec: Recording, speed: float = 1.0, start_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rec, self.speed, self.start_s, self.clock = rec, speed, max(0.0, start_s), clock
        self.scale = speed or 1.0
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.subs: dict[str, int] = {}  # subscription -> bytes sent
        self.seq = 0
        self._m0: float | None = None
        self._w0 = time.time()
        self._task: asyncio.Task[None] | None = None
        self.link = None
        self.series = timeline.gpu_series(rec.tl)  # per card, once

    # ---- the clock --------------------------------------------------------------
    def now_s(self) -> float:
        """Seconds since the recorded launch, as played now."""
        if self._m0 is None:
            return self.start_s
        return min(self.start_s + (self.clock() - self._m0) * self.speed, max(self.rec.end, self.start_s))

    def wall(self, rel: float) -> float:
        """The replay's wall-clock time of ``rel`` recorded seconds since the launch."""
        return self._w0 + (rel - self.start_s) / self.scale

    # ---- the client's interface -------------------------------------------------------
    async def start(self) -> p.Hello:
        if self._m0 is None:
            self._m0, self._w0 = self.clock(), time.time()
            self._task = asyncio.ensure_future(self._play())
        host = str(self.rec.record.get("host") or "host")
        return p.Hello(protocol=1, agent_version=f"replay at {self.speed:g}x", agent_sha="",
                       hostname=host, python="", pid=0, time=time.time(), gpu_source="replay", gpu_error=None,
                       capabilities=("snapshot", "logs"))

    def fresh(self) -> ReplayClient:
        return self

    async def call_with_progress(self, op: str, on_event: Callable[..., Any] | None,
                                 **args: Any) -> dict[str, Any]:
        if op == "configure":
            return {}
        if op == "snapshot":
            return self._snapshot_dict()
        if op == "subscribe":
            return self._subscribe(str(args.get("sub")), int(args.get("offset") or 0))
        if op == "unsubscribe":
            self.subs.pop(str(args.get("sub")), None)
            return {}
        if op == "read_range":
            return self._read_range(str(args.get("path")), int(args.get("offset") or 0),
                                    int(args.get("length") or 0))
        raise AgentRequestError(f"{op}: a replay changes nothing (it plays a recorded run)")

    async def events(self) -> AsyncIterator[Any]:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            yield item

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.queue.put_nowait(None)

    # ---- playing ------------------------------------------------------------------
    async def _play(self) -> None:
        last_snap = -SNAPSHOT_S
        ended = False
        while True:
            now = self.now_s()
            self._pump(now)
            done = now >= self.rec.end
            if self.clock() - last_snap >= SNAPSHOT_S or (done and not ended):
                last_snap, ended = self.clock(), done
                self.queue.put_nowait(self._snapshot(now))
            await asyncio.sleep(TICK_S)

    def _pump(self, now: float) -> None:
        played = self.rec.log_at(now)
        for sub, sent in list(self.subs.items()):
            if played > sent:
                self.subs[sub] = played
                self.queue.put_nowait(p.LogData(sub=sub, path=self.rec.log_path, inode=1, offset=sent,
                                                data=self.rec.log[sent:played]))

    def _subscribe(self, sub: str, offset: int) -> dict[str, Any]:
        played = self.rec.log_at(self.now_s())
        start = played + offset if offset < 0 else min(offset, played)
        if 0 < start < played:  # a tail starts at a whole line, as the agent's does
            cut = self.rec.log.find(b"\n", start - 1, played)
            start = cut + 1 if cut >= 0 else played
        start = max(0, start)
        self.subs[sub] = start
        self._pump(self.now_s())
        return {"inode": 1, "size": played, "offset": start}

    def _read_range(self, path: str, offset: int, length: int) -> dict[str, Any]:
        now = self.now_s()
        if path.endswith("/" + timeline.TIMELINE_FILE):  # the `t` screen: the timeline so far
            data = b"".join([json.dumps(self.rec.tl.header).encode() + b"\n",
                             *(line + b"\n" for t, line in self.rec.raw_lines if t <= now)])
        elif path == self.rec.log_path:
            data = self.rec.log[:self.rec.log_at(now)]
        else:
            raise AgentRequestError(f"{clean(path, newline=False)} is not part of this replay")
        return {"offset": offset, "b64": p.b64encode(data[offset:offset + length]),
                "size": len(data), "inode": 1}

    def _snapshot(self, now: float) -> p.Snapshot:
        d = self._snapshot_dict(now)
        self.seq += 1
        snap = p.parse_message(dict(d, type="snapshot", seq=self.seq, gpu_source="replay", gpu_error=None))
        assert isinstance(snap, p.Snapshot)  # a "snapshot" object parses as one, or raises
        return snap

    def _snapshot_dict(self, now: float | None = None) -> dict[str, Any]:
        now = self.now_s() if now is None else now
        return {"seq": self.seq, "time": self.wall(now), "host": {"hostname": self.rec.record.get("host")},
                "gpus": self._gpus(now), "processes": [], "runs": [self._run(now)]}

    def _run(self, now: float) -> dict[str, Any]:
        r = {k: v for k, v in self.rec.record.items() if k != "exit_info"}
        r.update(launched_at=self.wall(0.0), start_time=self.wall(self.rec.shift), state="running",
                 exit_code=None, signal=None, ended_at=None, pace=None)
        if isinstance(r.get("expected_load_s"), (int, float)):
            r["expected_load_s"] = r["expected_load_s"] / self.scale
        if self.rec.exit is not None and now >= self.rec.end:
            r.update(self.rec.record["exit_info"], ended_at=self.wall(self.rec.end))
        return r

    def _gpus(self, now: float) -> list[dict[str, Any]]:
        cards, held = [], False
        for ln in self.rec.tl.lines:
            if ln["t"] + self.rec.shift > now:
                break
            if isinstance(ln.get("c"), list):
                cards, held = ln["c"], ln.get("h") == 1
        out = []
        for idx, series in sorted(self.series.items()):
            if idx not in cards:
                continue
            past = [v for t, v in series if t + self.rec.shift <= now]
            if not past:
                continue
            mem, util, power = past[-1]
            pid = self.rec.record.get("pid")
            out.append({"index": idx, "name": None, "uuid": None,
                        "mem_used": int(mem * 2**30) if mem is not None else None, "mem_total": None,
                        "util": util, "temp": None, "power": power, "power_limit": None,
                        "processes": [{"pid": pid, "mem": None}] if held and isinstance(pid, int) else []})
        return out
