"""A run's timeline (``RUN_DIR/timeline.jsonl``, written on the host by the shim's pace
thread, ``remote/run/timeline.py`` describes its lines), read on demand through the agent's
``read_range`` and summed up for ``eagle3-tui runs show``.

Every byte is host text: lines that are not a JSON object are skipped and counted,
values of the wrong type are dropped, and every string is cleaned
(``hosttext.clean_tree``) before anything shows it. Every number too
(``tui.protocol.hostjson``): a line over ``LINE_MAX`` bytes or nested too deep, or one
holding a number that is not finite or beyond ``NUMBER_MAX`` (a loss: ``LOSS_MAX``), is
skipped and counted (``bad_lines``); the header keeps its sane fields and is counted.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field
from typing import Any

from tui.protocol import hostjson
from tui.protocol.hosttext import clean, clean_tree
from tui.protocol.jsontypes import JSONObject
from tui.protocol.records import RunRecord
from tui.transport import AgentApi

TIMELINE_FILE = "timeline.jsonl"
READ_MAX = 4 * 1024 * 1024  # the agent's read_range limit; the host keeps the file under 2 MB
DEFAULT_RUNS_DIR = "~/.cache/eagle3-tui/runs"
_AFTER_LOAD = ("loaded", "extracting", "training", "evaluating", "serving", "finished")
_OUTPUT = ("extracting", "training", "serving")
LINE_MAX = 64 * 1024  # bytes of one line: the host writes < 1 KB (8 cards' sample: 219)
LOSS_MAX = 1e300  # a diverging loss may be huge and still a float; beyond, it is no reading


def _num(v: Any) -> float | None:
    return hostjson.number(v)


def _sane(obj: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``obj`` with its absurd numbers replaced by None, and how many there were; the loss
    (``l``: LOSS or [LOSS, STEP]) may be as large as ``LOSS_MAX``."""
    lv = obj.pop("l", None)
    obj, bad = hostjson.checked(obj)
    if lv is not None:
        loss, step = (lv[0], lv[1]) if isinstance(lv, list) and len(lv) == 2 else (lv, None)
        if not isinstance(loss, str) and hostjson.number(loss, LOSS_MAX) is None:
            bad += 1
        elif isinstance(step, (int, float)) and hostjson.number(step) is None:
            bad += 1
        else:
            obj["l"] = lv
    return obj, bad


@dataclass
class Timeline:
    """The parsed file: the header and the lines in order, ``t`` a float on each."""

    header: dict[str, Any] = field(default_factory=dict)
    lines: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0
    raw: list[bytes] = field(default_factory=list)  # each of ``lines`` as the file has it (a replay's)

    @property
    def t0(self) -> float | None:
        return _num(self.header.get("t0"))


def parse(data: bytes) -> Timeline:
    """The timeline of the file's bytes; a torn or foreign line is skipped, never fatal."""
    tl = Timeline()
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            obj = hostjson.loads(raw, LINE_MAX)
        except ValueError:
            tl.bad_lines += 1
            continue
        if not isinstance(obj, dict):
            tl.bad_lines += 1
            continue
        obj, bad = _sane(obj)
        obj = clean_tree(obj)
        if "v" in obj and not tl.header and not tl.lines:
            tl.header = obj  # its absurd fields are None now: the rest of the file still counts
            tl.bad_lines += bool(bad)
            continue
        t = _num(obj.get("t"))
        if t is None or bad:
            tl.bad_lines += 1
            continue
        obj["t"] = t
        tl.lines.append(obj)
        tl.raw.append(raw)
    return tl


def run_dir(cfg_runs_dir: str | None, run_id: str) -> str:
    return posixpath.join(cfg_runs_dir or DEFAULT_RUNS_DIR, run_id)


async def fetch(client: AgentApi, runs_dir: str | None, run_id: str) -> Timeline | None:
    """The run's timeline from the host, or None when it has none (an adopted run, one
    launched before timelines, or one the agent cannot read)."""
    path = posixpath.join(run_dir(runs_dir, run_id), TIMELINE_FILE)
    try:
        chunk = await client.read_range(path, 0, READ_MAX)
    except Exception:  # noqa: BLE001 - no timeline (or an unreadable one) is an answer, not an error
        return None
    return parse(chunk.data)


def gpu_series(tl: Timeline) -> dict[int, list[tuple[float, list[Any]]]]:
    """Per card: [(t, [mem_gib, util, power])] with each sample's unchanged cards filled in."""
    out: dict[int, list[tuple[float, list[Any]]]] = {}
    cards: list[int] = []
    last: dict[int, list[Any]] = {}
    for ln in tl.lines:
        c = ln.get("c")
        if isinstance(c, list) and all(isinstance(i, int) for i in c):
            cards, last = list(c), {}
        g = ln.get("g")
        if not isinstance(g, list):
            continue
        for idx, vals in zip(cards, g):
            if isinstance(vals, list) and len(vals) == 3:
                last[idx] = [_num(v) for v in vals]
            if idx in last:
                out.setdefault(idx, []).append((ln["t"], last[idx]))
    return out


def _loss(v: Any) -> float | None:
    """A loss the host wrote (``l``): a number, or "nan" / "inf" / "-inf" as a float."""
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return _num(v)


def loss_series(tl: Timeline) -> list[tuple[float, float, int | None]]:
    """The training loss over the run: [(t, loss, step)], ``step`` the one the host wrote
    with it, else that of the last numbered ``train`` mark before it (None: no number)."""
    out: list[tuple[float, float, int | None]] = []
    step: int | None = None
    for ln in tl.lines:
        m = ln.get("m")
        if isinstance(m, list) and len(m) >= 2 and m[0] == "train" and isinstance(m[1], int) \
                and not isinstance(m[1], bool):  # not ["train", "line", N]: a loss line, no step
            step = m[1]
        lv = ln.get("l")
        at = step
        if isinstance(lv, list) and len(lv) == 2:  # [loss, step]
            lv, at = lv[0], lv[1] if isinstance(lv[1], int) and not isinstance(lv[1], bool) else None
        loss = _loss(lv)
        if loss is not None:
            out.append((ln["t"], loss, at))
    return out


def _json_loss(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)  # "nan", "inf", "-inf": strict JSON


def loss_summary(tl: Timeline, shift: float = 0.0) -> dict[str, Any] | None:
    """The run's training loss for `runs show`: the last one (its step and time) and the
    lowest finite one among the timeline's samples; None when the run logged no loss."""
    pts = loss_series(tl)
    if not pts:
        return None
    t, last, step = pts[-1]
    finite = [p for p in pts if math.isfinite(p[1])]
    low = min(finite, key=lambda p: p[1]) if finite else None
    return {"last": _json_loss(last), "last_step": step, "last_after_s": round(t + shift, 1),
            "min": low[1] if low else None, "min_step": low[2] if low else None,
            "min_after_s": round(low[0] + shift, 1) if low else None,
            "max": max(p[1] for p in finite) if finite else None, "points": len(pts)}


def end_time(tl: Timeline) -> float | None:
    """The `t` of the run's exit line, else of its last line; None when it has no lines."""
    ends: list[float] = [ln["t"] for ln in tl.lines if ln.get("e") == "exit"]  # parse(): t a float
    if ends:
        return ends[-1]
    return tl.lines[-1]["t"] if tl.lines else None


def _gpu_hours(tl: Timeline, end: float | None, start: float | None = None) -> float | None:
    """Card-seconds the run held cards (``h`` = 1), from each card-set line to the next
    or the end (only those after ``start`` when given), in hours; None when the run was
    never seen holding a card."""
    spans: list[tuple[float, int]] = []
    for ln in tl.lines:
        if isinstance(ln.get("c"), list):
            spans.append((ln["t"], len(ln["c"]) if ln.get("h") == 1 else 0))
    if not any(n for _, n in spans) or end is None:
        return None
    total = 0.0
    for (t, n), nxt in zip(spans, [s[0] for s in spans[1:]] + [end]):
        t = t if start is None else max(t, start)
        total += n * max(0.0, nxt - t)
    return round(total / 3600.0, 4)


def wasted(tl: Timeline, end: float | None) -> dict[str, Any] | None:
    """GPU-hours spent after the run diverged (its ``diverged`` event) or after its GPUs
    went idle for good (an attempt the host stopped for idle: its ``idle_since``), to the
    run's end: ``{"after": "divergence" | "idle", "t", "gpu_hours", "why"}``, or None."""
    t0 = tl.t0
    for ln in tl.lines:
        if ln.get("e") == "diverged":
            return {"after": "divergence", "t": ln["t"], "gpu_hours": _gpu_hours(tl, end, ln["t"]) or 0.0,
                    "why": ln.get("why"), "line": ln.get("line")}
        since = _num(ln.get("idle_since"))
        if ln.get("e") == "attempts" and ln.get("stopped") == "idle" and since is not None and t0 is not None:
            t = round(since - t0, 1)
            return {"after": "idle", "t": t, "gpu_hours": _gpu_hours(tl, end, t) or 0.0,
                    "why": ln.get("note"), "line": None}
    return None


def _throughput(tl: Timeline, phases: list[dict[str, Any]], end: float | None) -> list[dict[str, Any]]:
    """Per phase: steps of its progress marks over its time."""
    out = []
    for i, ph in enumerate(phases):
        start, stop = ph["t"], phases[i + 1]["t"] if i + 1 < len(phases) else end
        marks = [(ln["t"], ln["m"]) for ln in tl.lines
                 if isinstance(ln.get("m"), list) and len(ln["m"]) >= 2 and isinstance(ln["m"][0], str)
                 and isinstance(ln["m"][1], int) and start <= ln["t"] <= (stop if stop is not None else ln["t"])]
        kinds = {m[0] for _, m in marks}
        if len(marks) < 2 or len(kinds) != 1 or stop is None:
            continue
        steps = marks[-1][1][1] - marks[0][1][1]
        span = marks[-1][0] - marks[0][0]
        out.append({"phase": ph["phase"], "unit": clean(str(marks[0][1][0]), newline=False),
                    "steps": steps, "seconds": round(span, 1),
                    "per_s": round(steps / span, 3) if span > 0 else None})
    return out


def summary(tl: Timeline, run: RunRecord | None = None) -> dict[str, Any]:
    """What `runs show` prints: times are seconds since the launch (the header's
    ``launched_at``, else the process start)."""
    rec = run or RunRecord.parse({})  # no record: its fields empty
    t0 = tl.t0
    launched = _num(tl.header.get("launched_at")) or t0
    shift = (t0 - launched) if t0 is not None and launched is not None else 0.0
    end = end_time(tl)
    phases = [{"phase": str(ln.get("phase")), "t": ln["t"]} for ln in tl.lines if ln.get("e") == "phase"]
    load = next((p["t"] for p in phases if p["phase"] in _AFTER_LOAD), None)
    first = next((p["t"] for p in phases if p["phase"] in _OUTPUT), None)
    exits = [ln for ln in tl.lines if ln.get("e") == "exit"]
    series = gpu_series(tl)
    peak = {str(i): max((v[0] for _, v in s if v[0] is not None), default=None) for i, s in series.items()}
    patch = rec.patch_state if isinstance(rec.patch_state, dict) else {}
    attempts = [ln for ln in tl.lines if ln.get("e") == "attempts"]

    def since_launch(t: float | None) -> float | None:
        return round(t + shift, 1) if t is not None else None

    return {
        "run_id": (run.run_id if run else None) or tl.header.get("run"),
        "state": run.state if run else None,
        "outcome": _outcome(run, exits[-1] if exits else None),
        "launched_at": launched,
        "load_s": since_launch(load),
        # the host's history of this argv's loads (remote/run/history.py), kept in the record at launch
        "expected_load_s": rec.expected_load_s,
        "expected_load_runs": list(rec.expected_load_runs),
        "first_output_s": since_launch(first),
        "duration_s": since_launch(end),
        "throughput": _throughput(tl, phases, end),
        "gpu_hours": _gpu_hours(tl, end),
        "stopped": stopped_by_host(run),  # by the host, with its GPU-free proof
        # "wasted after divergence/idle": GPU-hours from that moment to the end
        "wasted": dict(w, after_s=since_launch(w.pop("t"))) if (w := wasted(tl, end)) else None,
        "loss": loss_summary(tl, shift),
        "peak_mem_gib": peak,
        "attempts": len(rec.attempts) or max(_ints(a.get("n") for a in attempts), default=1),
        "restarts": rec.restarts or max(_ints(a.get("restarts") for a in attempts), default=0),
        "patch_version": patch.get("version"),
        "phases": [{"phase": p["phase"], "at": round(launched + p["t"] + shift, 1) if launched else None,
                    "after_s": since_launch(p["t"])} for p in phases],
        "events": [dict(ln, t=since_launch(ln["t"])) for ln in tl.lines
                   if ln.get("e") not in (None, "phase")],
        "timeline_points": sum(1 for ln in tl.lines if "g" in ln or "s" in ln or "l" in ln),
        "timeline_bad_lines": tl.bad_lines,
    }


def _list(value: Any) -> list[Any]:
    """A record's list field; anything else (a hand-edited or torn record) is empty."""
    return value if isinstance(value, list) else []


def _ints(values: Any) -> list[int]:
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def stopped_by_host(run: RunRecord | None) -> dict[str, Any] | None:
    """The last attempt's stop decided on the host (remote/run/restart.py), with its GPU-free
    proof: ``{"what": "diverged" | "idle" | "hung", "why", "gpus_free", "gpus", "note"}``."""
    last: JSONObject = run.attempts[-1] if run is not None and run.attempts else {}
    what = last.get("stopped") or ("hung" if last.get("hung") else None)
    if what is None or last.get("restarted"):
        return None
    got = last.get("proof")
    proof: dict[str, Any] = got if isinstance(got, dict) else {}
    return {"what": str(what), "why": str(last.get("why") or what), "detail": last.get("stopped_why"),
            "gpus_free": proof.get("gpus_free"), "gpus": _list(proof.get("gpus")), "note": proof.get("note")}


def _outcome(run: RunRecord | None, exit_line: dict[str, Any] | None) -> str | None:
    state = run.state if run is not None else None
    code: object = run.exit_code if run is not None else None
    sig: object = run.signal if run is not None else None
    if exit_line is not None and code is None and sig is None:
        code, sig = exit_line.get("code"), exit_line.get("signal")
    if state in ("running", "pending"):
        return str(state)
    stop = stopped_by_host(run)
    if stop is not None:  # the host's supervisor stopped it (on_diverge / on_idle / on_hang = kill)
        return str(stop["why"])
    if sig:
        return "%s (%s)" % (state or "ended", sig) if state == "killed" else "signal %s" % sig
    if isinstance(code, int):
        return "exit 0" if code == 0 else "exit %d" % code
    return str(state) if state else None


COMPARED = ("outcome", "load_s", "first_output_s", "duration_s", "gpu_hours", "attempts", "restarts",
            "patch_version", "timeline_points")


def compare(a: dict[str, Any], b: dict[str, Any], run_a: RunRecord, run_b: RunRecord) -> dict[str, Any]:
    """`runs compare`: two summaries side by side, with each one's throughput per phase,
    peak memory per card, and where their argv and env differ (cleaned host text)."""
    def rates(s: dict[str, Any]) -> dict[str, Any]:
        return {t["phase"]: t.get("per_s") for t in s.get("throughput") or []}

    argv_a, argv_b = list(run_a.argv), list(run_b.argv)
    pa: dict[str, Any] = a.get("peak_mem_gib") or {}
    pb: dict[str, Any] = b.get("peak_mem_gib") or {}
    env_a, env_b = run_a.env, run_b.env
    return {
        "runs": [a.get("run_id"), b.get("run_id")],
        "fields": {k: [a.get(k), b.get(k)] for k in COMPARED},
        "throughput": {ph: [rates(a).get(ph), rates(b).get(ph)] for ph in {**rates(a), **rates(b)}},
        "peak_mem_gib": {c: [pa.get(c), pb.get(c)] for c in sorted({*pa, *pb}, key=str)},
        "argv": None if argv_a == argv_b else [argv_a, argv_b],
        "env": {k: [env_a.get(k), env_b.get(k)] for k in sorted({*env_a, *env_b}) if env_a.get(k) != env_b.get(k)},
    }
