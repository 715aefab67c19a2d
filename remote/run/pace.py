"""A run's progress pace, kept on the host so a client can tell a stall without having watched.

``Pace(log)`` reads what a run's log gained since its last look (``update(now)``) and
keeps what a stall needs: when the log last grew, the last progress step (the target
model's shard bar, the extractor's batches, else the log's line count) and when it
came, the recent intervals between steps in the current phase, and that phase as far
as the markers tell (starting, loading, loaded, extracting, training, serving, finished,
and diverged: remote/run/diverge.py's verdict, kept as ``diverged`` with when it was read;
a training loop's step or loss line is its progress). The
supervisor shim runs one in a thread for the run's whole life and writes it to
``RUN_DIR/pace.json``; the agent puts that record (``source: "shim"``) into each live
run's ``pace``, or for a run without one (adopted, or launched by an older shim) only
the log's mtime (``source: "mtime"``). The thresholds stay with the client
(``[watch]`` in eagle3.toml, ``tui/state/watch.py``).

After the load it also keeps ``idle_since``: since when the run's process group has
used no CPU (utime+stime from /proc unchanged between looks) and its GPUs (those it
holds, else all) stayed at most ``GPU_IDLE_UTIL`` % busy; ``gpu`` names the GPU
source, or says "none: why" when only the CPU was judged; ``held`` the GPU memory (bytes)
the run's processes held at the last idle look (what ``[watch] on_idle`` needs: GPUs held
and left idle). The GPUs are asked only when
the CPU ticks stood still since the last look: a run working on its CPU is awake
anyway, so a busy run's idle check costs no NVML or nvidia-smi call; the timeline's
sample (``remote/run/timeline.py``, every 10 s) reads them, and a look that falls with it
uses that reading. That is what lets a client
call a run hung without having watched it.

Stdlib only, Python >= 3.9. ``now`` is always passed in, so tests use a fake clock.
"""

import json
import os
import re
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from remote.base import atomicfile, procfs
from remote.base.wire import MAX_SCAN
from remote.run import diverge

PACE_FILE = "pace.json"
MAX_INTERVALS = 32  # intervals kept for the client's median
READ_MAX = 8 * 1024 * 1024  # bytes read per look; a bigger jump is skipped, not parsed
TICK_S = 5.0  # the shim's look interval
GPU_IDLE_UTIL = 5.0  # GPU utilisation (%) that counts as idle: [watch] idle_util's default
# The share of one core under which a run's processes count as asleep. Not exactly 0: a
# process holding a CUDA context still wakes now and then (the driver's own threads; on
# an H100 a job blocked after its load gained a few ticks a tick for ~2 minutes).
QUIET_SHARE = 0.01
_AFTER_LOAD = ("loaded", "extracting", "training", "evaluating")  # phases where a sleeping run may be hung
IDLE_PHASES = _AFTER_LOAD  # where restart.py's on_idle may call a run idle

# The target model's weight-loading bar: vLLM's "Loading safetensors checkpoint shards:
# 59% Completed | 38/64 [...]" or tqdm's "desc:  59%|█████▉    | 38/64 [...]".
# Read from its ":  59%" on (``_bar``): the description is the text before that colon, back
# to the previous one, with a loader's word at most 60 characters before the colon, and at
# most 120 characters before that word.
_PCT = re.compile(r":\s*\d{1,3}%")
_BAR_TAIL = re.compile(r"(?: Completed \||\|[^|\n]{0,200}\||)\s*(?P<n>\d{1,9})/(?P<total>\d{1,9})\s*\[")
_BAR_WORD = re.compile(r"(?i)shards|safetensors|checkpoint")
_BATCH = re.compile(r"\[extract\] batch (?P<b>\d{1,12})/(?P<bs>\d{1,12})")
_DONE = re.compile(r"\[extract\] done: ")
# A training loop's step (the client's tui/state/logtrain.py reads much more): a tqdm bar
# that is not a loader's, "step=N", "Step N |", "global_step: N", "iteration N/T", or a
# metrics line with a loss ({'loss': …}, "train/loss=…"), which counts one step per line.
# Linear on any line: no quantifier next to another over the same characters, a number
# starts where a digit run starts and has at most 12 digits (a longer one is no step), and
# "a loss or lr follows" is a second search from the step's end, not a lookahead that
# re-reads the rest of the line at each "step N".
_TRAIN_BAR = re.compile(r"(?<!\d)(?P<n>\d{1,12})/(?P<total>\d{1,12}) \[[\d:]{1,20}<[\d:?]{1,20}, *[\d.]{1,20}"
                        r"(?:it|s|step|batch)")
_TRAIN_STEP = re.compile(
    r"(?i)(?:\b(?:global_)?step\b['\"]?\s*(?:[=:]\s*)?|\biteration\s+)(?P<n>\d{1,12})(?!\d)"
    r"(?:\s*/\s*(?P<total>\d{1,12})(?!\d))?")
_TRAIN_AFTER = re.compile(r"(?i)\bloss\b|\blr\b|learning.rate")  # what a step's line goes on to say
_TRAIN_LOSS = re.compile(r"(?i)['\"]?\b(?:train[_/])?loss['\"]?\s*[:=]\s*[-+\d.na]")
# The training loss of a line that is a training step: the first of ``_LOSS_KEYS`` among
# its ``key: value`` / ``key=value`` pairs ({'loss': 0.5}, loss=0.5, train/loss=4.3e-04,
# Loss: 1.77); an evaluation's loss or a loss's parts (val/loss, eval_loss, loss_0) never.
# (the key is any word, kept when it names a loss: "[a-z_/]*loss[a-z_/]*" backtracks on
# "losslossloss…"; a number has at most 40 digits a side, so float() never reads 1 MB)
_LOSS_KV = re.compile(r"""(?i)(?<![\w/.-])['"]?([a-z_/]+)['"]?\s*[:=]\s*(?:tensor\()?"""
                      r"([-+]?(?:nan|inf|(?:\d{1,40}(?:\.\d{0,40})?|\.\d{1,40})(?:e[-+]?\d{1,4})?))(?![\w.])")
_LOSS_KEYS = ("loss", "train/loss", "train_loss", "training_loss", "train_loss_step", "train/loss_step",
              "total_loss", "train/total_loss", "reduced_train_loss", "lm_loss", "step_loss", "avg_loss")
_NOT_TRAIN = re.compile(r"(?i)shard|checkpoint|download|loading|processed prompts|map\b|tokeniz|"
                        r"val|eval|test|predict|rollout|capturing")
# A restarted run's next attempt begins (remote/run/restart.py): its pace starts afresh.
_ATTEMPT = re.compile(r"^\[eagle3-tui\] attempt \d+/\d+ starts")
_SERVING = re.compile(r"Uvicorn running on|Application startup complete|The server is fired up")
_LOADED = re.compile(r"Model loading took|Loading (?:model )?weights took")
# Lines that say "still waiting", not progress (the client's list, tui/state/watch.py).
_WAITING = (b"No available shared memory broadcast block", b"Waiting for output from",
            b"Please wait for sglang server", b"No available block found")


class Pace:
    """What one log has shown of its run's progress so far."""

    def __init__(self, log: str, record: Optional[Dict[str, Any]] = None) -> None:
        self.log = log
        r = record if isinstance(record, dict) and record.get("log") == log else {}
        self.offset = int(r.get("size") or 0)
        self.inode = r.get("inode")
        self.lines = int(r.get("lines") or 0)
        self.grew_at = r.get("grew_at")
        self.phase = str(r.get("phase") or "starting")
        self.step = r.get("step")
        self.step_at = r.get("step_at")
        self.intervals = [float(x) for x in r.get("intervals") or []][-MAX_INTERVALS:]
        self.target = r.get("target")  # the first loader bar's description
        self.mark = r.get("mark")
        self.cpu = r.get("cpu")  # the run's utime+stime ticks at the last sample
        self.idle_since = r.get("idle_since")
        self.gpu = r.get("gpu")
        self.held = r.get("held")  # bytes of GPU memory the run held at the last idle look (None: unknown)
        self.sampled_at = r.get("sampled_at")
        self.loss = r.get("loss")  # the latest training loss (``loss_value``), or None
        self.loss_step = r.get("loss_step")  # the training step it came at (None: no numbered step)
        self.train_n: Optional[int] = None  # the last numbered training step read
        # divergence (remote/run/diverge.py): the fold's state, and once diverged its verdict
        # with when pace read it ({"id", "why", "line_no", "line", "at"}); the phase is then
        # "diverged" until a restart's next attempt begins
        self.div = diverge.State()
        self.diverged = r.get("diverged") if isinstance(r.get("diverged"), dict) else None
        self.div_marked = self.diverged is not None  # the timeline has its mark (a reloaded record: yes)
        self.transitions: List[Tuple[float, str]] = []  # phases entered since the timeline's last look
        self._tail = b""

    def record(self) -> Dict[str, Any]:
        return {"source": "shim", "log": self.log, "size": self.offset, "inode": self.inode,
                "lines": self.lines, "grew_at": self.grew_at, "phase": self.phase, "step": self.step,
                "step_at": self.step_at, "intervals": list(self.intervals), "target": self.target,
                "mark": self.mark, "cpu": self.cpu, "idle_since": self.idle_since, "gpu": self.gpu, "held": self.held,
                "sampled_at": self.sampled_at, "loss": self.loss, "loss_step": self.loss_step,
                "diverged": self.diverged}

    def quiet(self, cpu: Optional[int], now: float) -> bool:
        """Whether the run's processes were asleep since the last look: ``cpu`` (their
        ticks now) grew by at most QUIET_SHARE of a core over the time between."""
        if cpu is None or self.cpu is None or self.sampled_at is None:
            return cpu is not None and cpu == self.cpu
        return 0 <= cpu - self.cpu <= QUIET_SHARE * max(0.0, now - self.sampled_at) * procfs.CLK_TCK

    def sample(self, now: float, cpu: Optional[int], gpu_busy: Optional[bool], gpu: Optional[str],
               held: Optional[int] = None) -> bool:
        """One look at the run's activity: ``cpu`` its ticks (None: no process found),
        ``gpu_busy`` whether its GPUs work (None: no GPU source, ``gpu`` says why).
        Keeps ``idle_since`` after the load only; True when it changed."""
        before = self.idle_since
        if self.phase not in _AFTER_LOAD:  # counted from the first look after the load
            self.cpu = self.sampled_at = self.idle_since = None
            return before is not None
        idle = self.quiet(cpu, now) and not gpu_busy
        if not idle:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = self.sampled_at if self.sampled_at is not None else now
        self.cpu, self.gpu, self.sampled_at = cpu, gpu, now
        was, self.held = self.held, held if idle else None
        return self.idle_since != before or self.held != was

    def update(self, now: float) -> bool:
        """Read the log's new bytes; True when anything changed."""
        try:
            st = os.stat(self.log)
        except OSError:
            return False
        if st.st_ino != self.inode or st.st_size < self.offset:  # a new or truncated file
            self.inode, self.offset, self._tail = st.st_ino, 0, b""
        if st.st_size == self.offset:
            return False
        start = max(self.offset, st.st_size - READ_MAX)
        try:
            with open(self.log, "rb") as f:
                f.seek(start)
                data = f.read(st.st_size - start)
        except OSError:
            return False
        if start > self.offset:
            self._tail = b""
        self.offset = start + len(data)
        self.grew_at = now
        self._feed(self._tail + data, now)
        return True

    def _feed(self, data: bytes, now: float) -> None:
        # tqdm redraws a bar with "\r"; every segment is a line for the markers
        parts = re.split(rb"[\r\n]", data)
        self._tail = parts.pop()[-4096:]
        newlines = data.count(b"\n")
        self.lines += newlines
        waiting_only = bool(parts) and all(any(w in p for w in _WAITING) for p in parts if p.strip())
        moved = False
        line_no = self.lines - newlines
        for raw in parts:  # the head of each line only: a line may be 1 GB (MAX_SCAN)
            line = raw[: MAX_SCAN * 4].decode("utf-8", "replace")[:MAX_SCAN]
            line_no += 1
            moved = self._marker(line, now) or moved
            self._diverge(line, line_no, now)
        if not moved and newlines and not waiting_only and self.phase in ("starting", "loaded", "serving"):
            self._step(("lines", self.lines), "log line %d" % self.lines, now)

    def _marker(self, line: str, now: float) -> bool:
        """One line's progress marker, if any; True when it was a step."""
        if _ATTEMPT.match(line):
            self.phase, self.target, self.mark, self.step, self.intervals = "starting", None, None, None, []
            self.loss = self.loss_step = self.train_n = None
            self.div, self.diverged, self.div_marked = diverge.State(), None, False
            self.transitions = (self.transitions + [(now, "starting")])[-32:]
            self.step_at, self.cpu, self.idle_since, self.sampled_at = now, None, None, None
            return True
        bar = _bar(line) if "%" in line else None
        if bar:
            desc = bar[0].strip()
            if self.target is None:
                self.target = desc
            if desc != self.target or self.phase not in ("starting", "loading"):
                return False  # another loader's bar, or a re-read after the load
            n, total = bar[1], bar[2]
            self._enter("loading" if n < total else "loaded", now)
            return self._step(("shard", n, total), "shard %d/%d" % (n, total), now)
        m = _BATCH.search(line)
        if m:
            self._enter("extracting", now)
            return self._step(("batch", int(m.group("b"))), "batch %s/%s" % (m.group("b"), m.group("bs")), now)
        if _DONE.search(line):
            self._enter("finished", now)
            return True
        step = self._train_step(line)
        if step is not None:
            self._enter("training", now)
            if isinstance(step[0][0], int):
                self.train_n = step[0][0]
            loss = line_loss(line)
            if loss is not None:  # a loss line without a step of its own: the last one read
                self.loss, self.loss_step = loss, self.train_n
            return self._step(("train",) + step[0], step[1], now)
        if _SERVING.search(line):
            self._enter("serving", now)
        elif _LOADED.search(line) and self.phase in ("starting", "loading"):
            self._enter("loaded", now)
        return False

    def _diverge(self, line: str, line_no: int, now: float) -> None:
        """Fold one line into the divergence check; the first verdict enters "diverged"."""
        if self.diverged is not None:
            return
        before = self.div
        self.div = diverge.fold(before, line, line_no)
        if self.div is not before and self.div.verdict is not None:
            self.diverged = dict(self.div.to_dict() or {}, at=now)
            self._enter("diverged", now)

    def _train_step(self, line: str) -> Optional[Tuple[Tuple[Any, ...], str]]:
        """(mark, label) of a training step this line shows, or None."""
        m = _TRAIN_BAR.search(line)
        if m and not _NOT_TRAIN.search(line[: m.start()].rsplit("]", 1)[-1]):
            return (int(m.group("n")),), "step %s/%s" % (m.group("n"), m.group("total"))
        m = _TRAIN_STEP.search(line)
        if m and _TRAIN_AFTER.search(line, m.end()):  # searched from the step on: \b still sees before it
            of = "/" + m.group("total") if m.group("total") else ""
            return (int(m.group("n")),), "step %s%s" % (m.group("n"), of)
        if _TRAIN_LOSS.search(line) and not re.search(r"(?i)\b(?:eval|val)[_/]loss", line):
            return ("line", self.lines), "training log line %d" % self.lines
        return None

    def _enter(self, phase: str, now: float) -> None:
        if self.phase == "diverged" and phase != "starting":
            return  # a diverged run stays diverged whatever it prints next
        if phase != self.phase:
            self.phase, self.intervals, self.mark = phase, [], None
            self.step_at = now
            self.transitions = (self.transitions + [(now, phase)])[-32:]

    def _step(self, mark: Any, label: str, now: float) -> bool:
        mark = list(mark)
        if mark == self.mark:
            return False
        if self.step_at is not None and self.mark is not None:
            self.intervals = (self.intervals + [round(now - self.step_at, 3)])[-MAX_INTERVALS:]
        self.mark, self.step, self.step_at = mark, label, now
        return True


def _bar(line: str) -> Optional[Tuple[str, int, int]]:
    """(description, n, total) of the first weight-loading bar in ``line``, or None."""
    for m in _PCT.finditer(line):
        tail = _BAR_TAIL.match(line, m.end())
        if not tail:
            continue
        colon = m.start()
        lo = line.rfind(":", 0, colon) + 1
        for w in _BAR_WORD.finditer(line, max(lo, colon - 80), colon):
            if w.end() >= colon - 60:
                return line[max(lo, w.start() - 120):colon], int(tail.group("n")), int(tail.group("total"))
    return None


def loss_value(text: str) -> Any:
    """A printed loss as the record keeps it: a float to 4 significant digits (the
    timeline's bytes), a non-finite one as the string "nan", "inf" or "-inf" (JSON has none)."""
    v = float(text)
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return float("%.4g" % v)


def line_loss(line: str, default: Any = None) -> Any:
    """The training loss a step's line prints (``loss_value``), else ``default``."""
    if ("oss" not in line and "OSS" not in line) or "train_runtime" in line:
        return default  # no loss, or HF Trainer's closing summary (its train_loss is the run's mean)
    found: Dict[str, str] = {}
    for m in _LOSS_KV.finditer(line[:MAX_SCAN]):
        key = m.group(1).lower()
        if "loss" in key:
            found.setdefault(key, m.group(2))
    for key in _LOSS_KEYS:
        if key in found:
            return loss_value(found[key])
    return default


def load(run_dir: str) -> Optional[Dict[str, Any]]:
    """``RUN_DIR/pace.json``, or None."""
    try:
        with open(os.path.join(run_dir, PACE_FILE)) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def save(run_dir: str, record: Dict[str, Any]) -> bool:
    """Atomically replace ``RUN_DIR/pace.json``; False when the disk had no room (ENOSPC,
    EDQUOT): the pace thread tries again on its next tick, never stops for it."""
    try:
        atomicfile.write_json(os.path.join(run_dir, PACE_FILE), record, indent=None)
    except OSError:
        return False
    return True


def from_mtime(log: Optional[str]) -> Optional[Dict[str, Any]]:
    """The fallback for a run nobody paced: when its log last changed."""
    if not log:
        return None
    try:
        st = os.stat(log)
    except OSError:
        return None
    return {"source": "mtime", "log": log, "size": st.st_size, "grew_at": st.st_mtime}


def group_cpu(pgid: Optional[int]) -> Tuple[Optional[int], List[int]]:
    """(utime+stime ticks, pids) of the processes in group ``pgid``; (None, []) if none."""
    if not pgid:
        return None, []
    total, pids = 0, []
    for pid in procfs.list_pids():
        st = procfs.read_stat(pid)
        if st is not None and st["pgid"] == pgid:
            total += st["utime"] + st["stime"]
            pids.append(pid)
    return (total if pids else None), pids


def gpu_busy(gpus: List[Dict[str, Any]], pids: List[int]) -> bool:
    """Whether the GPUs the run holds (all, when it holds none we can see) work."""
    held = [g for g in gpus if any(p.get("pid") in pids for p in g.get("processes") or [])]
    return any(g.get("util") is None or g["util"] > GPU_IDLE_UTIL for g in held or gpus)


def _gpu_source() -> Any:
    try:
        from remote.base import gpus

        return gpus.Gpus()
    except Exception:
        return None


def gpu_held(gpus: List[Dict[str, Any]], pids: List[int]) -> int:
    """Bytes of GPU memory the run's processes hold (0: none we can see)."""
    return sum(p.get("mem") or 0 for g in gpus for p in g.get("processes") or []
               if p.get("pid") in pids and isinstance(p.get("mem"), int))


def _gpu_look(source: Any, pids: List[int], found: Optional[List[Dict[str, Any]]] = None
              ) -> Tuple[Optional[bool], str, Optional[int]]:
    """(the run's GPUs busy?, the source or "none: why", bytes the run holds on them)."""
    if found is not None:  # this tick's reading, made for the timeline
        return gpu_busy(found, pids), str(source.source), gpu_held(found, pids)
    if source is None:
        return None, "none: GPU reader unavailable", None
    try:
        found, error = source.read()
    except Exception as exc:
        return None, "none: %s" % (str(exc) or type(exc).__name__), None
    if error or not found:
        return None, "none: %s" % (error or "no GPUs"), None
    return gpu_busy(found, pids), str(source.source), gpu_held(found, pids)


def _gpu_read(source: Any) -> Optional[List[Dict[str, Any]]]:
    """The GPUs now, or None (no source, or it failed)."""
    try:
        found, error = source.read() if source is not None else ([], "none")
    except Exception:
        return None
    return found if found and not error else None


def follow(run_dir: str, log: str, stop: threading.Event, tick: float = TICK_S,
           pgid: Optional[int] = None, recorder: Any = None) -> None:
    """The shim's pace thread: look every ``tick`` seconds until ``stop``, once more at
    the end, and write ``pace.json`` whenever it changed; with a ``recorder``
    (``timeline.Recorder``) also the run's timeline: its GPUs are read when a timeline
    sample falls due (every ``timeline.SAMPLE_S``), and that reading serves the idle
    check of the same tick. Never raises."""
    try:
        pace = Pace(log, load(run_dir))
        if pace.step_at is None:
            pace.step_at = time.time()  # the run's start is where "no progress since" counts from
        unsaved = not save(run_dir, pace.record())
        source = _gpu_source() if pgid else None
        while True:
            ended = stop.wait(tick)
            now = time.time()
            changed = pace.update(now)
            found, cpu, pids = None, None, []  # type: Tuple[Optional[List[Dict[str, Any]]], Optional[int], List[int]]
            if recorder is not None and pgid and recorder.sample_due(now):
                cpu, pids = group_cpu(pgid)
                found = _gpu_read(source)
            if pgid and pace.phase in _AFTER_LOAD:  # activity matters only after the load
                if not pids:
                    cpu, pids = group_cpu(pgid)
                gpu: Optional[str]  # the source of the GPU reading, or "none: why"
                if pace.quiet(cpu, now):  # asleep on the CPU: are its GPUs working?
                    busy, gpu, held = _gpu_look(source, pids, found)
                else:  # working on the CPU (or gone): awake whatever the GPUs do; no query
                    busy, gpu, held = None, pace.gpu, pace.held
                changed = pace.sample(now, cpu, busy, gpu, held) or changed
            elif pgid:
                changed = pace.sample(now, None, None, None) or changed
            if changed or unsaved:
                unsaved = not save(run_dir, pace.record())
            if recorder is not None:
                _record(recorder, run_dir, pace, now, found, pids, ended)
            if ended:
                return
    except Exception:  # a pace thread must never take the shim down
        return


def _record(recorder: Any, run_dir: str, pace: Pace, now: float,
            found: Optional[List[Dict[str, Any]]], pids: List[int], last: bool = False) -> None:
    try:
        if pace.diverged is not None and not pace.div_marked:  # the moment it diverged, once
            pace.div_marked = True
            d = pace.diverged
            at = d.get("at") if isinstance(d.get("at"), (int, float)) else now
            recorder.event(at, "diverged", id=d.get("id"), why=d.get("why"), line=d.get("line"))
        recorder.look(now, pace.phase, pace.step, pace.mark, pace.idle_since, found, pids,
                      [p for _, p in pace.transitions], offset=pace.offset, loss=pace.loss,
                      loss_step=pace.loss_step, last=last)
        pace.transitions = []
        recorder.attempts(now, run_dir, load_json)
    except Exception:  # the timeline must never take the pace down
        pass


def load_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def attach(runs: List[Dict[str, Any]], runs_dir: str) -> None:
    """Give each live run record its ``pace``: the shim's record, else the log's mtime."""
    for r in runs:
        if r.get("state") != "running" or "pace" in r:
            continue
        rec = None
        if not r.get("external") and r.get("run_id"):
            rec = load(os.path.join(runs_dir, str(r["run_id"])))
        r["pace"] = rec or from_mtime(r.get("log"))
