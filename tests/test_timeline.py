"""The run's timeline on the host (remote/run/timeline.py, written by the shim's pace thread)
and its summary (`eagle3-tui runs show`, tui/services/timeline.py).

Real processes: the CLI launches a real job through the real agent and shim, with no
client connected while it runs; a stand-in `nvidia-smi` (no GPU here) reports 8 cards,
four of which list the job's pid once it says its model is loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from textual.app import App

from remote.run import pace as hostpace
from remote.run import timeline as hosttl
from tests import checkout, timeline_fixture
from tui.protocol.records import RunRecord
from tui.services import timeline
from tui.views.screens.timeline import TimelineScreen

JOB = Path(__file__).parent / "jobs" / "timeline_job.py"

# 8 cards; while HELD holds a pid, cards 0-3 list it with 40 GiB in use at 90 %.
FAKE_SMI = """#!{python}
import os, sys
arg = sys.argv[1]
try:
    pid = open({held!r}).read().strip()
except OSError:
    pid = ""
uuid = "GPU-00000000-0000-0000-0000-00000000000%d"
if arg.startswith("--query-gpu="):
    for i in range(8):
        busy = pid and i < 4
        print("%d, NVIDIA H200, %s, %d, 143771, %d, 35, %.2f, 700.00"
              % (i, uuid % i, 40960 if busy else 0, 90 if busy else 0, 500.0 if busy else 80.0))
elif arg.startswith("--query-compute-apps="):
    for i in range(4 if pid else 0):
        print("%s, %s, 40960" % (uuid % i, pid))
else:
    sys.exit("unexpected " + arg)
"""


def _e3(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env=checkout.env(**env))


def _launch_until_exit(tmp_path: Path, run_toml: str, env: dict[str, str]) -> tuple[str, Path]:
    """`eagle3-tui launch local` of the config's [run] (`run_toml`, cwd = tmp_path) with no
    client left connected; waits up to 40 s for the shim's exit record. (run id, run dir)."""
    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\n'
        f'[run]\ncwd = "{tmp_path}"\n' + run_toml)
    launched = _e3("launch", "local", "--json", cwd=tmp_path, env=env)
    assert launched.returncode == 0, launched.stderr
    run_id = json.loads(launched.stdout)["run_id"]
    run_dir = tmp_path / "runs" / run_id
    deadline = time.monotonic() + 40
    while not (run_dir / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    return run_id, run_dir


def test_a_run_nobody_watched_leaves_a_timeline_that_matches_what_happened(tmp_path: Path) -> None:
    held, times = tmp_path / "held", tmp_path / "times.json"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, held=str(held)))
    smi.chmod(0o755)
    env = {"EAGLE3_TUI_GPU_SOURCE": "nvidia-smi", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "EAGLE3_TUI_PACE_S": "0.2", "EAGLE3_TUI_TIMELINE_S": "0.5"}
    run_id, run_dir = _launch_until_exit(
        tmp_path, f'name = "tl"\ncommand = {json.dumps([sys.executable, str(JOB), str(held), str(times)])}\n', env)
    assert (run_dir / "exit.json").exists()
    seen = json.loads(times.read_text())
    launched_at = json.loads((run_dir / "launch.json").read_text())["launched_at"]

    shown = _e3("runs", "show", "local", run_id, "--json", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    s = json.loads(shown.stdout)
    (tmp_path / "show.json").write_text(shown.stdout)
    # the load: the host's pace sees the "loaded" line within a tick (0.2 s) or two
    assert abs(s["load_s"] - (seen["loaded"] - launched_at)) < 1.0, (s, seen)
    assert abs(s["first_output_s"] - (seen["first_batch"] - launched_at)) < 1.0, (s, seen)
    assert [p["phase"] for p in s["phases"]] == ["starting", "loading", "loaded", "extracting", "finished"]
    assert s["outcome"] == "exit 0" and s["attempts"] == 1 and s["restarts"] == 0
    # 4 cards held from the load until the job let go (sampled every 0.5 s)
    held_s = (seen["end"] - 0.8) - seen["loaded"]
    assert abs(s["gpu_hours"] * 3600 - 4 * held_s) < 4 * 1.2, (s["gpu_hours"] * 3600, 4 * held_s)
    # before the run held a card the timeline kept all 8 (idle), then its 4
    assert s["peak_mem_gib"] == {str(i): 40.0 if i < 4 else 0.0 for i in range(8)}
    (extract,) = [t for t in s["throughput"] if t["phase"] == "extracting"]
    # 20 batches in 4 s; the steps counted start at the pace thread's first sample of the
    # phase, which a loaded machine delays (13 seen once in a CI rehearsal): at least half
    assert extract["unit"] == "batch" and extract["steps"] >= 10 and 2.0 < extract["per_s"] < 6.0, extract
    assert s["timeline_points"] > 5 and s["timeline_bad_lines"] == 0
    assert any(e["e"] == "exit" and e["code"] == 0 for e in s["events"])
    text = _e3("runs", "show", "local", run_id, cwd=tmp_path, env=env)
    (tmp_path / "show.txt").write_text(text.stdout)
    assert text.returncode == 0 and "GPU-hours" in text.stdout and "extracting" in text.stdout, text

    # a second run of the same command, with a different env item: compared side by side
    toml = (tmp_path / "eagle3.toml").read_text()
    (tmp_path / "eagle3.toml").write_text(toml + 'env = { BATCH = "8" }\n')
    second = _e3("launch", "local", "--json", cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr
    run_b = json.loads(second.stdout)["run_id"]
    deadline = time.monotonic() + 40
    while not (tmp_path / "runs" / run_b / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    cmp = _e3("runs", "compare", "local", run_id, run_b, "--json", cwd=tmp_path, env=env)
    assert cmp.returncode == 0, cmp.stderr
    c = json.loads(cmp.stdout)
    (tmp_path / "compare.json").write_text(cmp.stdout)
    assert c["runs"] == [run_id, run_b] and c["fields"]["outcome"] == ["exit 0", "exit 0"]
    assert all(abs(x - s["load_s"]) < 1.0 for x in c["fields"]["load_s"]), c
    assert c["env"] == {"BATCH": [None, "8"]} and c["argv"] is None
    assert c["peak_mem_gib"]["0"] == [40.0, 40.0] and set(c["throughput"]) == {"loading", "extracting"}
    text = _e3("runs", "compare", "local", run_id, run_b, cwd=tmp_path, env=env)
    (tmp_path / "compare.txt").write_text(text.stdout)
    assert text.returncode == 0 and "env BATCH" in text.stdout, text
    bad = _e3("runs", "compare", run_id, cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "two run ids" in bad.stderr, bad
    missing = _e3("runs", "compare", "local", run_id, "20990101-000000-beef", cwd=tmp_path, env=env)
    assert missing.returncode == 1 and "no run 20990101-000000-beef on this host" in missing.stderr, missing

    pruned = _e3("runs", "prune", "local", "--keep", "0", "--json", cwd=tmp_path, env=env)
    assert pruned.returncode == 0 and not run_dir.exists(), pruned  # the timeline went with its run


TRAIN_JOB = Path(__file__).parent / "jobs" / "train_job.py"
SPECULATORS_LOG = Path(__file__).parent / "fixtures" / "logs" / "speculators030_train_cpu.log"


@pytest.mark.parametrize("kind", ["speculators", "hf"])
def test_a_training_run_nobody_watched_leaves_its_loss_on_the_timeline(tmp_path: Path, kind: str) -> None:
    """A real process prints a trainer's log with no client connected; the host's timeline
    keeps its training loss over the run (never an evaluation's loss, nor HF's closing mean),
    its last loss is the last one printed, and `runs show` gives the last and the lowest."""
    out = tmp_path / "printed.json"
    env = {"EAGLE3_TUI_PACE_S": "0.2", "EAGLE3_TUI_TIMELINE_S": "0.5", "EAGLE3_TUI_GPU_SOURCE": "none"}
    argv = [sys.executable, str(TRAIN_JOB), kind, str(out), str(SPECULATORS_LOG)]
    run_id, run_dir = _launch_until_exit(tmp_path, f'name = "tr"\ncommand = {json.dumps(argv)}\n', env)
    assert (run_dir / "exit.json").exists()
    printed = [hostpace.loss_value(repr(x)) for x in json.loads(out.read_text())]
    tl = timeline.parse((run_dir / hosttl.TIMELINE_FILE).read_bytes())
    points = timeline.loss_series(tl)
    kept = [v for _, v, _ in points]
    assert len(kept) >= 3 and set(kept) <= set(printed), (kept, printed)
    assert kept[-1] == printed[-1]  # the run's last look writes the last loss printed
    assert [t for t, _, _ in points] == sorted(t for t, _, _ in points)  # on the run's time axis
    assert 7.777 not in kept and 8.888 not in kept  # eval_loss, HF's closing train_loss

    shown = _e3("runs", "show", "local", run_id, "--json", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    loss = json.loads(shown.stdout)["loss"]
    assert loss["last"] == printed[-1] and loss["min"] == min(kept) and loss["points"] == len(kept), loss
    if kind == "hf":  # the bar's step at the last loss (speculators prints no step)
        assert loss["last_step"] == 40, loss  # the bar that ended just before it
    text = _e3("runs", "show", "local", run_id, cwd=tmp_path, env=env)
    assert text.returncode == 0 and f"loss         last {printed[-1]}" in text.stdout, text.stdout
    (tmp_path / "show.txt").write_text(text.stdout)


def test_the_recorder_writes_a_loss_when_it_changes_and_the_last_one_at_the_end(tmp_path: Path) -> None:
    rec = hosttl.Recorder(str(tmp_path), 0.0, "r", sample_s=10.0)
    for now, loss, step in ((0.0, 2.5, 10), (5.0, 2.0, 20), (10.0, 2.0, 20), (20.0, "nan", 30),
                            (30.0, 1.5, None), (32.0, 1.25, 40)):
        rec.look(now, "training", "step %d" % (step or 0), ["train", step or 0], None, None, [],
                 loss=loss, loss_step=step, last=now == 32.0)  # 32 s: the run's last look, no sample due
    rec.close()
    tl = timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes())
    assert [ln["l"] for ln in tl.lines if "l" in ln] == [[2.5, 10], [2.0, 20], ["nan", 30], 1.5, [1.25, 40]]
    s = timeline.summary(tl)["loss"]
    assert (s["last"], s["last_step"], s["min"], s["min_step"], s["max"], s["points"]) == (1.25, 40, 1.25, 40, 2.5, 5)
    json.dumps(s, allow_nan=False)
    from tui.cli.report import format_show

    assert "  loss         last 1.25 (step 40, +32.0 s), lowest 1.25 (step 40, +32.0 s)" in format_show(
        timeline.summary(tl)), format_show(timeline.summary(tl))


def test_a_torn_last_line_loses_only_itself_and_host_text_is_cleaned(tmp_path: Path) -> None:
    rec = hosttl.Recorder(str(tmp_path), 1000.0, "r1", launched_at=999.0, sample_s=10)
    rec.look(1000.0, "loading", "shard 1/8", ["shard", 1, 8], None, None, [])
    gpus = [{"index": i, "mem_used": 2 ** 30 * 3, "util": 50, "power": 100.0,
             "processes": [{"pid": 7}] if i == 1 else []} for i in range(2)]
    rec.look(1010.0, "loaded\x1b[31m", "shard 8/8", ["shard", 8, 8], None, gpus, [7])
    rec.event(1020.0, "exit", code=0, signal=None)
    rec.close()
    path = tmp_path / hosttl.TIMELINE_FILE
    with path.open("ab") as f:
        f.write(b'{"t": 30, "g": [[1')  # a crash mid-write
    tl = timeline.parse(path.read_bytes())
    assert tl.bad_lines == 1 and tl.header["run"] == "r1"
    s = timeline.summary(tl)
    assert [p["phase"] for p in s["phases"]] == ["loading", "loaded"]  # the escape is gone
    assert s["load_s"] == 11.0 and s["duration_s"] == 21.0  # since the launch, 1 s before t0
    assert s["gpu_hours"] == round(10 / 3600, 4)  # one card, from 10 s to the exit at 20 s
    assert os.stat(path).st_mode & 0o077 == 0


def test_the_file_is_never_opened_through_a_symlink_nor_when_someone_else_may_write_it(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / hosttl.TIMELINE_FILE).symlink_to(tmp_path / "elsewhere")
    rec = hosttl.Recorder(str(tmp_path), 1000.0)
    rec.event(1001.0, "exit", code=0)
    assert rec.fd is None and (tmp_path / "elsewhere").read_text() == ""
    # A timeline left by a job before (a Slurm restart) is carried on only when it is ours alone.
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    run_dir.chmod(0o755)  # others may enter: a file's own write bits count
    path = run_dir / hosttl.TIMELINE_FILE
    hosttl.Recorder(str(run_dir), 1000.0, "r1").close()
    before = path.read_bytes()
    path.chmod(0o666)
    rec = hosttl.Recorder(str(run_dir), 1100.0, "r1")
    rec.event(1101.0, "exit", code=0)
    assert rec.fd is None and path.read_bytes() == before
    if os.geteuid() == 0:  # a file another user owns (root can make one)
        path.chmod(0o600)
        os.chown(path, 65534, 65534)
        rec = hosttl.Recorder(str(run_dir), 1100.0, "r1")
        rec.event(1101.0, "exit", code=0)
        assert rec.fd is None and path.read_bytes() == before


def test_a_restart_as_a_new_job_carries_on_the_timeline_past_a_torn_line(tmp_path: Path) -> None:
    """A Slurm run's next job starts a new shim in the same run dir: its recorder appends
    to the file the dead job left, on the same time axis, and the dead job's torn last
    line stays the one line lost."""
    gpus = [{"index": 0, "mem_used": 2 ** 30 * 3, "util": 50, "power": 100.0, "processes": [{"pid": 7}]}]
    job1 = hosttl.Recorder(str(tmp_path), 1000.0, "r1", launched_at=999.0, sample_s=10)
    job1.look(1000.0, "loading", "shard 1/8", ["shard", 1, 8], None, gpus, [7])
    job1.close()
    path = tmp_path / hosttl.TIMELINE_FILE
    with path.open("ab") as f:
        f.write(b'{"t": 30, "g": [[1')  # the job died mid-write
    job2 = hosttl.Recorder(str(tmp_path), 1100.0, "r1", launched_at=1099.0, sample_s=10)
    job2.look(1100.0, "extracting", "batch 2", ["batch", 2], None, gpus, [8])  # pid 8 holds nothing
    job2.event(1160.0, "exit", code=0, signal=None)
    job2.close()
    tl = timeline.parse(path.read_bytes())
    assert tl.header == {"v": 1, "t0": 1000.0, "run": "r1", "launched_at": 999.0} and tl.bad_lines == 1
    assert [ln["t"] for ln in tl.lines] == [0.0, 0.0, 0.0, 100.0, 100.0, 100.0, 160.0], tl.lines
    assert [ln.get("s") for ln in tl.lines if "s" in ln] == ["shard 1/8", "batch 2"]
    s = timeline.summary(tl)
    assert s["duration_s"] == 161.0 and [p["phase"] for p in s["phases"]] == ["loading", "extracting"]
    assert s["gpu_hours"] == round(100 / 3600, 4)  # held by job 1 until job 2's first sample says not


def test_the_job_that_ends_for_a_restart_stops_the_run_s_gpu_hours(tmp_path: Path) -> None:
    gpus = [{"index": 0, "mem_used": 2 ** 30, "util": 50, "power": 100.0, "processes": [{"pid": 7}]}]
    job1 = hosttl.Recorder(str(tmp_path), 1000.0, "r1", sample_s=10)
    job1.look(1000.0, "extracting", "batch 1", ["batch", 1], None, gpus, [7])
    job1.event(1036.0, "resubmitted", code=1, signal=None)
    job1.release(1036.0)
    job1.close()
    job2 = hosttl.Recorder(str(tmp_path), 1900.0, "r1", sample_s=10)  # queued for 864 s
    job2.look(1900.0, "extracting", "batch 2", ["batch", 2], None, gpus, [7])
    job2.event(1936.0, "exit", code=0, signal=None)
    job2.close()
    s = timeline.summary(timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes()))
    assert s["gpu_hours"] == round(72 / 3600, 4), s  # 36 s in each job, none while queued


def test_a_day_on_eight_cards_stays_under_two_megabytes(tmp_path: Path) -> None:
    """24 h at the shim's pace, every card changing every sample (the worst case), a new
    progress step, a new training loss of the longest spelling and more log every sample:
    the file stays under MAX_BYTES, and a sample stays within the bytes the README states."""
    rec = hosttl.Recorder(str(tmp_path), 0.0, "day")
    now, n = 0.0, 0
    while now < 86400:
        gpus = [{"index": i, "mem_used": (70 + (n + i) % 9) * 2 ** 30, "util": (n * 7 + i) % 101,
                 "power": 300 + (n * 13 + i) % 400, "processes": [{"pid": 1}]} for i in range(8)]
        step = 982_000 + n  # 6 digits, as a trainer's step counter at most
        rec.look(now, "training", "step %d/999999" % step, ["train", step], None,
                 gpus if rec.sample_due(now) else None, [1], offset=n * 120,  # the log grows too
                 loss=hostpace.loss_value("-%d.%03de-05" % (1 + n % 9, n % 1000)), loss_step=step)  # "-1.234e-05"
        now += 5.0
        n += 1
    data = (tmp_path / hosttl.TIMELINE_FILE).read_bytes()
    size, longest = len(data), max(len(ln) + 1 for ln in data.split(b"\n") if b'"g"' in ln)
    assert b'"l":[-1.' in data
    print(f"24 h x 8 cards, worst case: {size} bytes, a sample at most {longest} bytes")
    assert size <= hosttl.MAX_BYTES and longest <= 219


# ---------------------------------------------------------------- the timeline screen


class _TimelineApp(App[None]):
    def __init__(self, tl: timeline.Timeline) -> None:
        super().__init__()
        self.tl = tl

    def on_mount(self) -> None:
        self.push_screen(TimelineScreen("20261130-015500-ab12", self.tl, RunRecord.parse(
            {"run_id": "20261130-015500-ab12", "state": "exited", "exit_code": 0})))


def _screen_app(tmp_path: Path, cards: int) -> _TimelineApp:
    return _TimelineApp(timeline_fixture.record(tmp_path, cards))


def test_timeline_screen_8_cards_80x24(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(_screen_app(tmp_path, 8), terminal_size=(80, 24))


def test_timeline_screen_8_cards_160x50(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(_screen_app(tmp_path, 8), terminal_size=(160, 50))


def test_timeline_screen_of_a_training_run_80x24(snap_compare: Any, tmp_path: Path) -> None:
    """The loss row first, on the same axis, with its lowest, highest and last value."""
    assert snap_compare(_TimelineApp(timeline_fixture.record(tmp_path, 8, train=True)), terminal_size=(80, 24))


def test_timeline_screen_of_a_training_run_160x50(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(_TimelineApp(timeline_fixture.record(tmp_path, 8, train=True)), terminal_size=(160, 50))


def test_timeline_screen_without_gpus_80x24(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(_screen_app(tmp_path, 0), terminal_size=(80, 24))


# A job that dies of a transient cause on its first attempt and finishes on its second.
RESTARTED = """
import os, sys, time
count = sys.argv[1]
n = int(open(count).read()) + 1 if os.path.exists(count) else 1
open(count, "w").write(str(n))
for b in range(1, 4):
    print("[extract] batch %d/3 (1 samples)" % b, flush=True)
    time.sleep(0.4)
if n == 1:
    print("[rank0]:[E1201 03:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
          "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 milliseconds before "
          "timing out.", flush=True)
    sys.exit(1)
print("[extract] done: 3 samples", flush=True)
"""


def test_a_restarted_run_s_timeline_has_its_attempts(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(RESTARTED)
    env = {"EAGLE3_TUI_PACE_S": "0.2", "EAGLE3_TUI_TIMELINE_S": "0.5", "EAGLE3_TUI_GPU_SOURCE": "none"}
    # The wait (1 s) spans several pace ticks (0.2 s), so the recorder sees attempts.json
    # while the failed attempt is its last even on a loaded machine.
    run_id, _ = _launch_until_exit(
        tmp_path, 'name = "tl2"\n'
        f'command = {json.dumps([sys.executable, str(tmp_path / "job.py"), str(tmp_path / "n")])}\n'
        'restart = "on-failure"\nrestart_delay = 1\nrestart_delay_max = 1\ngraces = [0.5, 0.5]\n', env)
    shown = _e3("runs", "show", "local", run_id, "--json", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    s = json.loads(shown.stdout)
    assert s["outcome"] == "exit 0" and s["attempts"] == 2 and s["restarts"] == 1, s
    causes = [e.get("cause") for e in s["events"] if e["e"] == "attempts"]
    assert "nccl-timeout" in causes, s["events"]
    # the second attempt starts afresh: extracting again after a "starting"
    assert [p["phase"] for p in s["phases"]][-3:] == ["starting", "extracting", "finished"], s["phases"]
    assert s["gpu_hours"] is None  # no GPU source: never seen holding a card
