"""The run's timeline (remote/run/timeline.py) read back as `runs show` and the timeline
screen read it (tui/services/timeline.py), where fresh bugs went unnoticed (issue 41):
a card set that changes (a run that takes or drops cards, cards renumbered, the run's
set versus the host's) loses no sample; past each size cap the file stays bounded and
the run's exit is still there; the training loss keeps 4 significant digits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remote.run import pace as hostpace
from remote.run import timeline as hosttl
from tui.services import timeline

GIB = 2**30
# A few values, so that a card often reads the same as before (the "unchanged" null).
VALUES = st.tuples(st.sampled_from([0, 40 * GIB, 70 * GIB]), st.sampled_from([0, 90]), st.sampled_from([80.0, 500.0]))
READING = st.tuples(
    st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True),  # the cards seen
    st.lists(st.booleans(), min_size=4, max_size=4),  # which list the run's pid
    st.lists(VALUES, min_size=4, max_size=4),
)


def _gpus(cards: list[int], held: list[bool], values: list[tuple[int, int, float]]) -> list[dict[str, Any]]:
    return [{"index": i, "mem_used": m, "util": u, "power": w, "processes": [{"pid": 7}] if h else []}
            for i, h, (m, u, w) in zip(cards, held, values)]


def _expected(gpus: list[dict[str, Any]]) -> dict[int, list[Any]]:
    """What the sample says of each card: the run's cards when it holds any, else all."""
    held = [g for g in gpus if g["processes"]]
    return {g["index"]: [float(v) if v is not None else None for v in hosttl.card_values(g)] for g in held or gpus}


def _series_at(tl: timeline.Timeline) -> dict[float, dict[int, list[Any]]]:
    by_t: dict[float, dict[int, list[Any]]] = {}
    for idx, points in timeline.gpu_series(tl).items():
        for t, vals in points:
            by_t.setdefault(t, {})[idx] = vals
    return by_t


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(READING, min_size=1, max_size=10), st.lists(st.booleans(), min_size=10, max_size=10))
def test_every_sample_of_every_card_reads_back_whatever_the_card_set_does(
        tmp_path_factory: pytest.TempPathFactory, readings: list[Any], released: list[bool]) -> None:
    run_dir = tmp_path_factory.mktemp("tl")
    rec = hosttl.Recorder(str(run_dir), 0.0, "r", sample_s=10.0)
    want: dict[float, dict[int, list[Any]]] = {}
    for n, (cards, held, values) in enumerate(readings):
        now = 10.0 * n
        gpus = _gpus(cards, held, values)
        rec.look(now, "extracting", "batch %d" % n, ["batch", n], None, gpus, [7])
        want[now] = _expected(gpus)
        if released[n]:  # a Slurm run's job ended and the next one waits: no card held
            rec.release(now + 5.0)
    rec.close()
    got = _series_at(timeline.parse((run_dir / hosttl.TIMELINE_FILE).read_bytes()))
    # A sample line tells every card of the set (null: as in the set's previous sample);
    # a sample with no line is one where no card of an unchanged set changed.
    for n, t in enumerate(want):
        if t in got:
            assert got[t] == want[t], (t, got[t], want[t])
        else:
            assert n > 0 and want[t] == want[10.0 * (n - 1)] and not released[n - 1], (t, want[t])
    assert set(got) <= set(want)


def test_a_card_the_run_keeps_when_it_drops_others_keeps_its_samples(tmp_path: Path) -> None:
    """The case by hand: 4 cards held, then only cards 0 and 1 (their values unchanged),
    then the same 2 again: card 0 is in the sample after the change, with its values (the
    third, all unchanged, needs no line)."""
    same = (40 * GIB, 90, 500.0)
    rec = hosttl.Recorder(str(tmp_path), 0.0, "r", sample_s=10.0)
    rec.look(0.0, "extracting", "b1", ["batch", 1], None, _gpus([0, 1, 2, 3], [True] * 4, [same] * 4), [7])
    rec.look(10.0, "extracting", "b2", ["batch", 2], None, _gpus([0, 1], [True, True], [same] * 2), [7])
    rec.look(20.0, "extracting", "b3", ["batch", 3], None, _gpus([0, 1], [True, True], [same] * 2), [7])
    rec.close()
    series = timeline.gpu_series(timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes()))
    assert [t for t, _ in series[0]] == [0.0, 10.0] and series[0][-1][1] == [40.0, 90.0, 500.0]
    assert [t for t, _ in series[3]] == [0.0]


@pytest.fixture
def small_caps(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    """The caps at a few kilobytes (same order and ratios as the real ones), so a test
    reaches each in a few hundred lines rather than a day of samples."""
    caps = (3_000, 6_000, 7_000)
    monkeypatch.setattr(hosttl, "THIN_AT", caps[0])
    monkeypatch.setattr(hosttl, "SAMPLE_CAP", caps[1])
    monkeypatch.setattr(hosttl, "MAX_BYTES", caps[2])
    return caps


def test_past_every_cap_the_file_stays_bounded_and_the_exit_is_still_told(tmp_path: Path,
                                                                          small_caps: tuple[int, int, int]) -> None:
    thin_at, sample_cap, max_bytes = small_caps
    rec = hosttl.Recorder(str(tmp_path), 0.0, "r", sample_s=10.0)
    now, n = 0.0, 0
    sizes: list[tuple[float, int]] = []
    while now < 40_000:
        gpus = _gpus([0], [True], [(n % 3 * GIB, n % 100, 100.0 + n % 7)])
        rec.look(now, "phase-%d" % (n // 4 % 2), "batch %d" % n, ["batch", n], None,
                 gpus if rec.sample_due(now) else None, [7], offset=n * 10)
        sizes.append((now, rec.size))
        now += 5.0
        n += 1
    assert rec.size >= max_bytes  # the phase events alone went past the last cap
    rec.event(now, "exit", code=3, signal=None)
    rec.event(now, "idle")  # nothing but the exit past the cap
    rec.close()
    data = (tmp_path / hosttl.TIMELINE_FILE).read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    assert json.loads(last) == {"t": now, "e": "exit", "code": 3, "signal": None}
    assert len(data) - len(last) - 1 <= max_bytes + 200  # one line may cross the cap, no more
    tl = timeline.parse(data)
    s = timeline.summary(tl)
    assert s["outcome"] is not None and "3" in json.dumps(s["outcome"]), s["outcome"]
    assert s["duration_s"] == now
    # samples thin out past THIN_AT and stop past SAMPLE_CAP
    times = [ln["t"] for ln in tl.lines if "g" in ln]
    thin_t = next(t for t, size in sizes if size >= thin_at)
    cap_t = next(t for t, size in sizes if size >= sample_cap)
    gaps = [b - a for a, b in zip(times, times[1:]) if a > thin_t + hosttl.THIN_S]
    assert gaps and min(gaps) >= hosttl.THIN_S
    assert all(t <= cap_t for t in times)


def test_the_exit_of_a_carried_on_timeline_past_its_cap_is_told(tmp_path: Path,
                                                                small_caps: tuple[int, int, int]) -> None:
    """A Slurm run's next job appends to a file already past the cap: its exit still lands."""
    first = hosttl.Recorder(str(tmp_path), 0.0, "r")
    for i in range(400):
        first.event(float(i), "phase", phase="p%d" % (i % 2))
    first.close()
    assert (tmp_path / hosttl.TIMELINE_FILE).stat().st_size >= small_caps[2]
    second = hosttl.Recorder(str(tmp_path), 500.0, "r")
    second.look(510.0, "training", "step 1", ["train", 1], None,
                _gpus([0], [True], [(GIB, 1, 1.0)]), [7], loss=1.5, loss_step=1)
    second.event(520.0, "exit", code=0, signal=None)
    second.close()
    tl = timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes())
    exits = [ln for ln in tl.lines if ln.get("e") == "exit"]
    assert exits == [{"t": 520.0, "e": "exit", "code": 0, "signal": None}]
    assert not any("g" in ln or "l" in ln for ln in tl.lines)  # nothing else past the cap


@pytest.mark.parametrize(("printed", "kept"), [
    ("2.34567", 2.346),
    ("0.123449", 0.1234),
    ("10.4449", 10.44),
    ("1.23456e-05", 1.235e-05),
    ("-0.98765", -0.9877),
    ("3.5", 3.5),
    ("7", 7.0),
])
def test_a_loss_is_kept_to_four_significant_digits(printed: str, kept: float) -> None:
    assert hostpace.loss_value(printed) == kept
    line = "{'loss': %s, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}" % printed
    assert hostpace.line_loss(line) == kept


def test_two_losses_that_differ_in_the_fourth_digit_are_two_points(tmp_path: Path) -> None:
    """A slowly falling loss (2.346 then 2.345) is a change the timeline keeps."""
    rec = hosttl.Recorder(str(tmp_path), 0.0, "r", sample_s=10.0)
    for n, printed in enumerate(("2.3461", "2.3452", "2.3449")):
        rec.look(10.0 * n, "training", "step %d" % n, ["train", n], None, None, [],
                 loss=hostpace.loss_value(printed), loss_step=n)
    rec.close()
    points = timeline.loss_series(timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes()))
    assert [v for _, v, _ in points] == [2.346, 2.345, 2.345]


def test_a_card_sample_is_memory_to_a_tenth_of_a_gib_and_whole_percent_and_watts(tmp_path: Path) -> None:
    """What `runs show` and the timeline screen print of a card, from the line as written:
    GiB to 0.1 (binary gigabytes), utilisation and power rounded to integers, N/A kept."""
    rec = hosttl.Recorder(str(tmp_path), 1000.0, "r", sample_s=10.0)
    rec.look(1012.34, "extracting", "b1", ["batch", 1], None,
             [{"index": 3, "mem_used": int(40.26 * GIB), "util": 90.5, "power": 500.49, "processes": [{"pid": 7}]},
              {"index": 5, "mem_used": None, "util": None, "power": 61.5, "processes": [{"pid": 7}]}], [7])
    rec.close()
    lines = [json.loads(ln) for ln in (tmp_path / hosttl.TIMELINE_FILE).read_text().splitlines()]
    assert lines[0]["t0"] == 1000.0
    cards = next(ln for ln in lines if "c" in ln)
    sample = next(ln for ln in lines if "g" in ln)
    assert cards == {"t": 12.3, "c": [3, 5], "h": 1}
    assert sample["t"] == 12.3 and sample["g"] == [[40.3, 90, 500], [None, None, 62]]


def test_a_tick_that_read_no_loss_writes_none_and_keeps_the_last(tmp_path: Path) -> None:
    """Trainers print a loss every few steps, not every tick: a tick without one writes
    no loss, and the run's last loss stays the last one printed."""
    rec = hosttl.Recorder(str(tmp_path), 0.0, "r", sample_s=10.0)
    rec.look(0.0, "training", "step 10", ["train", 10], None, None, [], loss=2.5, loss_step=10)
    rec.look(10.0, "training", "step 11", ["train", 11], None, None, [], loss=None, loss_step=None)
    rec.look(20.0, "training", "step 12", ["train", 12], None, None, [], loss=2.5, loss_step=10, last=True)
    rec.close()
    tl = timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes())
    assert [ln["l"] for ln in tl.lines if "l" in ln] == [[2.5, 10]]
    assert timeline.summary(tl)["loss"]["last"] == 2.5


def test_a_clean_handoff_to_the_next_job_adds_no_blank_line(tmp_path: Path) -> None:
    """One JSON object per line, across a Slurm run's jobs: a file that ended cleanly is
    carried on as it is (only a torn last line gets a newline first)."""
    first = hosttl.Recorder(str(tmp_path), 100.0, "r")
    first.event(110.0, "resubmitted", code=1, signal=None)
    first.close()
    second = hosttl.Recorder(str(tmp_path), 500.0, "r")
    second.event(520.0, "exit", code=0, signal=None)
    second.close()
    text = (tmp_path / hosttl.TIMELINE_FILE).read_text()
    assert text.endswith("\n") and "\n\n" not in text
    assert [json.loads(ln).get("e") for ln in text.splitlines()] == [None, "resubmitted", "exit"]
    assert json.loads(text.splitlines()[-1])["t"] == 420.0  # on the first job's axis


def test_the_log_offset_is_written_when_it_changes_and_never_as_null(tmp_path: Path) -> None:
    """`o` is what lets a replay play the log in step: written when pace read more, not
    repeated, never a null (a tick that read no log keeps the last one)."""
    rec = hosttl.Recorder(str(tmp_path), 0.0, "r", sample_s=10.0)
    for n, offset in enumerate((100, 100, None, 250, 250)):
        rec.look(10.0 * n, "extracting", "batch %d" % n, ["batch", n], None, None, [], offset=offset)
    rec.close()
    tl = timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes())
    assert [(ln["t"], ln["o"]) for ln in tl.lines if "o" in ln] == [(0.0, 100), (30.0, 250)]


def test_samples_come_every_ten_seconds_at_most(tmp_path: Path) -> None:
    """The bound the 2 MB budget is made of (a day on 8 cards): one sample per SAMPLE_S."""
    rec = hosttl.Recorder(str(tmp_path), 0.0, "r")
    for s in range(0, 41):
        now = float(s)
        gpus = _gpus([0], [True], [(s * GIB, s, 100.0 + s)]) if rec.sample_due(now) else None
        rec.look(now, "extracting", "batch %d" % s, ["batch", s], None, gpus, [7])
    rec.close()
    tl = timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes())
    assert [ln["t"] for ln in tl.lines if "g" in ln] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert [ln["t"] for ln in tl.lines if "s" in ln] == [0.0, 10.0, 20.0, 30.0, 40.0]  # progress too


def test_a_full_disk_costs_the_timeline_never_the_run(tmp_path: Path) -> None:
    """The pace thread writes the timeline beside the run: ENOSPC (the file's descriptor
    pointed at /dev/full, which fails every write as a full disk does) raises nothing."""
    rec = hosttl.Recorder(str(tmp_path), 0.0, "r", sample_s=10.0)
    assert rec.fd is not None
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, rec.fd)
    os.close(full)
    rec.look(0.0, "extracting", "b1", ["batch", 1], None, _gpus([0], [True], [(GIB, 1, 1.0)]), [7], loss=1.0)
    rec.event(1.0, "exit", code=0, signal=None)
    fd = rec.fd
    os.close(fd)  # and a descriptor gone under it: close() too says nothing
    rec.close()
    assert rec.fd is None


def test_the_restart_supervisors_record_is_one_event_per_change(tmp_path: Path) -> None:
    """attempts.json is stat'ed each tick; the timeline gets an `attempts` event when it
    changed, not one per tick while it stays the same (a run waiting 10 minutes to
    restart would fill the timeline's size cap with copies)."""
    rec = hosttl.Recorder(str(tmp_path), 1000.0, "r")
    path = tmp_path / "attempts.json"
    for t in range(1001, 1006):  # no record yet: nothing
        rec.attempts(float(t), str(tmp_path), hostpace.load_json)
    path.write_text(json.dumps({"restarts": 1, "attempts": [{"n": 1, "cause": {"id": "nccl-timeout"}}],
                                "restart_at": 1100.0, "note": "restarting"}))
    for t in range(1006, 1016):
        rec.attempts(float(t), str(tmp_path), hostpace.load_json)
    path.write_text(json.dumps({"restarts": 1, "attempts": [{"n": 1}, {"n": 2}], "note": "finished"}))
    os.utime(path, (2000.0, 2000.0))  # a change the stat sees whatever the clock's grain
    for t in range(1016, 1020):
        rec.attempts(float(t), str(tmp_path), hostpace.load_json)
    rec.close()
    tl = timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes())
    events = [ln for ln in tl.lines if ln.get("e") == "attempts"]
    assert [(e["n"], e["note"]) for e in events] == [(1, "restarting"), (2, "finished")], events


def _timeline_of_size(run_dir: Path, size: int) -> None:
    """A run's timeline (header, then samples) of exactly `size` bytes, as the job before
    this one left it (a Slurm run's next job carries it on)."""
    run_dir.mkdir(mode=0o700, exist_ok=True)
    head = (json.dumps({"v": 1, "t0": 1000.0, "run": "r", "launched_at": None}) + "\n").encode()
    line = b'{"t":1.0,"s":"step 1"}\n'
    body = head + line * ((size - len(head)) // len(line) - 1)
    pad = size - len(body) - len(b'{"t":2.0,"s":""}\n')
    body += b'{"t":2.0,"s":"' + b"x" * pad + b'"}\n'
    assert len(body) == size
    path = run_dir / hosttl.TIMELINE_FILE
    path.write_bytes(body)
    os.chmod(path, 0o600)


@pytest.mark.parametrize("size", [hosttl.SAMPLE_CAP - 1, hosttl.SAMPLE_CAP, hosttl.MAX_BYTES - 1, hosttl.MAX_BYTES])
def test_each_cap_holds_from_its_very_byte(tmp_path: Path, size: int) -> None:
    """A timeline carried on at a cap's exact size: from SAMPLE_CAP bytes no more samples
    (not even the run's last look), from MAX_BYTES no more lines at all, but the exit
    event always; one byte below a cap, what it bounds still comes."""
    run_dir = tmp_path / "run"
    _timeline_of_size(run_dir, size)
    rec = hosttl.Recorder(str(run_dir), 2000.0, "r")
    rec.look(2001.0, None, None, None, None, None, [], offset=4096, last=True)  # the run's last sample
    rec.event(2002.0, "phase", phase="diverged")
    rec.event(2003.0, "exit", code=0)
    rec.close()
    added = (run_dir / hosttl.TIMELINE_FILE).read_bytes()[size:].decode().splitlines()
    kinds = [json.loads(ln).get("e", "sample") for ln in added]
    want = (["sample"] if size < hosttl.SAMPLE_CAP else []) + (["phase"] if size < hosttl.MAX_BYTES else [])
    assert kinds == want + ["exit"], added


def test_a_look_with_nothing_new_writes_nothing(tmp_path: Path) -> None:
    """A run stuck at one step for hours (a hang, a long evaluation) with no GPU reading:
    each due sample has nothing new to say and adds no line; the timeline's bytes go to
    what changed."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    rec = hosttl.Recorder(str(run_dir), 1000.0, "r", sample_s=10.0)
    for k in range(20):
        rec.look(1000.0 + 10 * k, "training", "step 7", ["train", 7], None, None, [], offset=512)
    rec.close()
    tl = timeline.parse((run_dir / hosttl.TIMELINE_FILE).read_bytes())
    samples = [ln for ln in tl.lines if "e" not in ln]
    assert len(samples) == 1 and samples[0].get("s") == "step 7", tl.lines
