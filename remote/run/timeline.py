"""A run's whole timeline, kept on the host by the supervisor shim's pace thread:
``RUN_DIR/timeline.jsonl``, one JSON object per line, appended with one ``write()`` each.

Lines (keys short: a day on 8 cards must fit in ``MAX_BYTES``):

* ``{"v": 1, "t0": EPOCH, "run": RUN_ID, "launched_at": EPOCH}`` -- the first line;
  ``t0`` is when the shim started the run; every ``t`` below is seconds since ``t0``, to 0.1 s.
* ``{"t": T, "c": [i, ...], "h": 0|1}`` -- the cards the samples below describe (their
  indices), and whether the run holds them (1) or they are all the host's (0, the run
  holds none we can see); written when that set changes.
* ``{"t": T, "g": [[mem_gib, util_pct, power_w] | null, ...]}`` -- one GPU sample, in
  the order of ``c``; ``null`` for a card whose rounded values did not change since the
  previous sample (memory to 0.1 GiB, utilisation and power to integers; a value the
  source lacks is null inside the triple).
* ``{"t": T, "s": STEP, "m": MARK}`` -- progress (pace's step label and mark: shard
  ``["shard", n, total]``, ``["batch", n]``, ``["train", n]``, ``["lines", n]``); with
  ``g`` on the same line when both fall due together.
* ``"l": [LOSS, STEP]`` or ``"l": LOSS`` on a progress sample -- the training loss pace
  last read from the log (``pace.loss_value``: a float to 4 significant digits, or
  ``"nan"`` / ``"inf"`` / ``"-inf"``) and the training step it came at (the line's own,
  else the last numbered step before it; a bare ``LOSS`` when the trainer prints no step
  number), written when either changed. The run's last look writes its progress and
  loss even when no sample is due, so the last loss printed is the timeline's.
* ``"o": BYTES`` on a sample or a ``phase`` event -- how much of the run's log pace had
  read by then (written when it changed): what lets a replay (``eagle3-tui replay``)
  play the log in step with the rest.
* ``{"t": T, "e": KIND, ...}`` -- an event: ``phase`` (``phase``), ``idle`` /
  ``awake`` (the run's CPU and GPUs stood still after its load; pace's ``idle_since``),
  ``diverged`` (``id``, ``why``, ``line``: the moment pace read that the run diverged,
  remote/run/diverge.py; ``runs show`` counts the GPU-hours after it as wasted),
  ``attempts`` (the restart supervisor's ``restarts``, ``note``, ``restart_at``, the
  last attempt's ``n`` and ``cause``; for an attempt the host stopped, ``stopped``
  ("diverged" | "idle"), ``gpus_free`` (its proof) and, for idle, ``idle_since``
  (epoch): the moment its GPUs went idle, from which ``runs show`` counts the waste),
  ``exit`` (``code``, ``signal``: a kill shows as the run's signal), ``resubmitted`` (a
  Slurm run's job ended and the run goes on as a new job: ``code``, ``signal`` of the
  job that ended).

Sampling: progress and GPUs at most every ``SAMPLE_S`` seconds (the shim's tick is 5 s),
a phase change or an event at once. Bounded: past ``THIN_AT`` bytes samples come every
``THIN_S`` s, past ``SAMPLE_CAP`` none, past ``MAX_BYTES`` nothing but the exit.
Crash-safe: each line is one ``write()`` on an ``O_APPEND`` fd; a line torn by a crash
is the last one, and the reader skips any line that is not a JSON object. The file is
opened ``O_NOFOLLOW`` in the run's own dir, and only when this user owns it and no one
else may write it (``trust.open_file``).

One timeline per run, across its attempts: local restarts run under the one shim; a
Slurm run restarted as a new job (remote/run/restart.py) gets a new shim, which appends to
the file the job before it left -- its header's ``t0`` kept (so ``t`` goes on), a torn
last line from the dead job ended with a newline first (so it loses only itself), the
file's size counted against the bounds. The job that ended writes ``resubmitted`` and an
empty card set (``"c": [], "h": 0``: no cards held while the next job is queued).

Sane numbers only: a value that is not a finite number within ``NUMBER_MAX`` (a step of
400 digits a job printed, a NaN reading) is left out where it would be written -- the
progress of that sample, a card's reading, an event's field -- never written for a
client to trip on (a loss may be as large as any float, or "nan"/"inf"/"-inf"). A step's
label is cut to ``LABEL_MAX`` characters.

Stdlib only, Python >= 3.9. ``now`` is passed in, so tests use a fake clock.
"""

import json
import math
import os
from typing import Any, Dict, List, Optional

from remote.base import trust

TIMELINE_FILE = "timeline.jsonl"
SAMPLE_S = 10.0
THIN_AT, THIN_S = 1_500_000, 60.0
SAMPLE_CAP, MAX_BYTES = 1_900_000, 2_000_000
_GIB = 1024.0 ** 3
NUMBER_MAX = 1e15  # the client's bound (tui/protocol/hostjson.py): beyond it a number is no reading
LABEL_MAX = 200


def sane(value: Any) -> bool:
    """A finite JSON number within NUMBER_MAX (an int too big for a float is not)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -NUMBER_MAX <= value <= NUMBER_MAX
    return math.isfinite(value) and -NUMBER_MAX <= value <= NUMBER_MAX


def _r(value: Any, digits: int = 0) -> Any:
    if not sane(value):
        return None
    return round(float(value), digits) if digits else int(round(value))


def _mark_ok(mark: Any) -> bool:
    """A progress mark whose numbers are all sane (["train", n], ["shard", n, total], …)."""
    return not isinstance(mark, list) or all(sane(v) for v in mark if isinstance(v, (int, float)))


def _loss_ok(loss: Any) -> bool:
    return loss in ("nan", "inf", "-inf") or (
        isinstance(loss, float) and math.isfinite(loss)) or (isinstance(loss, int) and sane(loss))


def card_values(gpu: Dict[str, Any]) -> List[Any]:
    """[memory GiB to 0.1, utilisation %, power W] of one card in gpus.py's shape."""
    mem = gpu.get("mem_used")
    return [_r(mem / _GIB, 1) if isinstance(mem, (int, float)) and sane(mem) else None,
            _r(gpu.get("util")), _r(gpu.get("power"))]


class Recorder:
    """The appending side; every method swallows OSError (a full disk costs the timeline,
    never the run or its pace)."""

    def __init__(self, run_dir: str, now: float, run_id: Optional[str] = None,
                 launched_at: Any = None, sample_s: float = SAMPLE_S) -> None:
        self.sample_s = sample_s
        self.path = os.path.join(run_dir, TIMELINE_FILE)
        self.t0 = now
        self.size = 0
        self.fd: Optional[int] = None
        self.cards: Optional[List[int]] = None
        self.held: Optional[int] = None
        self.last: Dict[int, List[Any]] = {}
        self.due = now  # the next sample
        self.step: Any = None
        self.loss: Any = None  # the training loss, as last written
        self.phase: Optional[str] = None
        self.idle = False
        self.attempts_mtime: Optional[float] = None
        self.offset: Optional[int] = None  # the log bytes read, as last written
        try:
            self.fd = trust.open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, "timeline")
        except (OSError, trust.Untrusted):
            return
        if not self._go_on(self.fd):
            self._write({"v": 1, "t0": round(now, 2), "run": run_id or os.path.basename(run_dir),
                         "launched_at": _r(launched_at, 2) if launched_at else None}, True)

    def _go_on(self, fd: int) -> bool:
        """Carry on the run's timeline when the file already holds it (a Slurm run's next
        job after a restart): keep its ``t0``, so every ``t`` stays on one axis, count its
        bytes against the bounds, and end a torn last line (the job before died mid-write)
        so that it stays the one line lost. False for a new or headerless file."""
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                size += os.write(fd, b"\n")
            first = os.pread(fd, 4096, 0).split(b"\n", 1)[0] if size else b""
        except OSError:
            return False
        self.size = size
        try:
            t0 = json.loads(first.decode("utf-8", "replace")).get("t0") if first else None
        except (ValueError, AttributeError):
            t0 = None
        if not isinstance(t0, (int, float)) or isinstance(t0, bool):
            return False  # a new file, or no header to go on from: a header after what is there
        self.t0 = float(t0)
        return True

    def _write(self, obj: Dict[str, Any], force: bool = False) -> None:
        if self.fd is None or (self.size >= MAX_BYTES and not force):
            return
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        try:
            os.write(self.fd, line)
            self.size += len(line)
        except OSError:
            pass

    def _t(self, now: float) -> float:
        return round(now - self.t0, 1)

    def event(self, now: float, kind: str, **fields: Any) -> None:
        self._write(dict({"t": self._t(now), "e": kind}, **fields), force=kind == "exit")

    def sample_due(self, now: float) -> bool:
        return now >= self.due and self.size < SAMPLE_CAP

    def look(self, now: float, phase: str, step: Any, mark: Any, idle_since: Optional[float],
             gpus: Optional[List[Dict[str, Any]]], pids: List[int],
             passed: Optional[List[str]] = None, offset: Optional[int] = None,
             loss: Any = None, loss_step: Optional[int] = None, last: bool = False) -> None:
        """One tick of the pace loop: a phase change or idle change at once (``passed``:
        every phase entered since the last look, so one left within a tick is kept too);
        progress, its training ``loss`` (at ``loss_step``) and ``gpus`` (a reading made because `sample_due`
        said so, else None) when due, progress and loss also on the run's ``last`` look;
        ``offset``: the log bytes pace has read, kept with both."""
        for p in (passed or [])[:32]:
            if p != self.phase:
                self.phase = p
                self.event(now, "phase", phase=p, **self._offset(offset))
        if phase != self.phase:
            self.phase = phase
            self.event(now, "phase", phase=phase, **self._offset(offset))
        if (idle_since is not None) != self.idle:
            self.idle = idle_since is not None
            self.event(now, "idle" if self.idle else "awake")
        due = self.sample_due(now)
        if not due and not (last and self.size < SAMPLE_CAP):
            return
        if due:
            self.due = now + (THIN_S if self.size >= THIN_AT else self.sample_s)
        rec: Dict[str, Any] = {"t": self._t(now)}
        if isinstance(step, str):
            step = step[:LABEL_MAX]
        if step != self.step and _mark_ok(mark):  # an absurd mark: this sample has no progress
            self.step = step
            rec.update(s=step, m=mark)
        if not _loss_ok(loss):
            loss = None
        lv = [loss, loss_step] if isinstance(loss_step, int) and sane(loss_step) and loss is not None else loss
        if lv is not None and lv != self.loss:
            self.loss = rec["l"] = lv
        if gpus and due:
            self._cards(rec, gpus, pids)
        rec.update(self._offset(offset))
        if len(rec) > 1:
            self._write(rec)

    def _offset(self, offset: Optional[int]) -> Dict[str, Any]:
        if not isinstance(offset, int) or not sane(offset) or offset == self.offset:
            return {}
        self.offset = offset
        return {"o": offset}

    def _cards(self, rec: Dict[str, Any], gpus: List[Dict[str, Any]], pids: List[int]) -> None:
        held = [g for g in gpus if any(p.get("pid") in pids for p in g.get("processes") or [])]
        chosen = held or gpus
        cards = [idx if isinstance(idx := g.get("index"), int) else i for i, g in enumerate(chosen)]
        if cards != self.cards or int(bool(held)) != self.held:
            self.cards, self.held = cards, int(bool(held))
            self._write({"t": rec["t"], "c": cards, "h": self.held})
            self.last = {}
        row: List[Any] = []
        for idx, g in zip(cards, chosen):
            vals = card_values(g)
            row.append(None if self.last.get(idx) == vals else vals)
            self.last[idx] = vals
        if any(v is not None for v in row):
            rec["g"] = row

    def release(self, now: float) -> None:
        """The run holds no card from now on (its Slurm job ended and the next one waits in
        the queue): an empty card set, so GPU-hours stop until the next job's samples."""
        if self.cards or self.held:
            self.cards, self.held, self.last = [], 0, {}
            self._write({"t": self._t(now), "c": [], "h": 0})

    def attempts(self, now: float, run_dir: str, read_json: Any) -> None:
        """An ``attempts`` event when the restart supervisor's ``attempts.json`` changed
        (one stat per tick)."""
        path = os.path.join(run_dir, "attempts.json")
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            mtime = None
        if mtime is not None and mtime != self.attempts_mtime:
            self.attempts_mtime = mtime
            rec = read_json(path)
            if isinstance(rec, dict):
                last = (rec.get("attempts") or [{}])[-1]
                last = last if isinstance(last, dict) else {}
                marks = {k: last[k] for k in ("stopped", "idle_since") if last.get(k) is not None}
                if isinstance(last.get("proof"), dict):  # the stop's GPU-free proof, in short
                    marks["gpus_free"] = last["proof"].get("gpus_free")
                if "idle_since" in marks:  # a host file's number: written only when sane
                    marks["idle_since"] = _r(marks["idle_since"], 2)
                self.event(now, "attempts", restarts=_r(rec.get("restarts")), note=rec.get("note"),
                           restart_at=_r(rec.get("restart_at"), 2), n=_r(last.get("n")),
                           cause=(last.get("cause") or {}).get("id") if isinstance(last.get("cause"), dict) else None,
                           **marks)

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
