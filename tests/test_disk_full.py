"""Nothing lost on a full disk: the shim's exit record survives ENOSPC (its space is
reserved at launch), keeps the exit code and says "no space left on device in DIR",
and the client says "disk full", not "lost". A launch onto a full disk says so in one
line, and a run that started is stopped or recorded, never left running unlisted. A
real full filesystem: a 1 MiB tmpfs mounted in the test (root, or root of a user
namespace: tests/run runs these so for a normal user), filled to exact pages."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from remote.base import procfs
from remote.run import launch, reserve, rundir
from tui.cli.report import format_runs
from tui.protocol.records import RunRecord
from tui.services.actions import state_of
from tui.services.config import load_config
from tui.state import view

pytestmark = pytest.mark.needs_root("disk full: a 1 MiB tmpfs mounted in the test", userns=True)

JOB = """\
import os, sys, time
go = sys.argv[1]
print("started", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
sys.exit(3)
"""


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode:  # root without CAP_SYS_ADMIN (a container): say so, not an error
        pytest.skip(f"cannot mount a tmpfs here: {(done.stderr.strip() or str(done.returncode)).splitlines()[0]}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(where: Path) -> None:
    """Write until the filesystem says ENOSPC."""
    with open(where / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    with pytest.raises(OSError):
        (where / "probe").write_bytes(b"x" * 8192)


def _wait_ended(runs: Path, run_id: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = next(r for r in rundir.list_runs(str(runs)) if r["run_id"] == run_id)
        if rec["state"] != "running":
            return rec
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} still running")


def _cfg(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "eagle3.toml").write_text('[run]\nname = "full"\nargv = ["true"]\n')
    return load_config(tmp_path / "eagle3.toml")


def test_exit_code_and_reason_survive_a_disk_filled_while_the_job_runs(small_fs: Path, tmp_path: Path) -> None:
    runs = small_fs / "runs"
    go = tmp_path / "go"
    rec = launch.launch(str(runs), "full", [sys.executable, "-c", JOB, str(go)], str(tmp_path), {})
    run_id = rec["run_id"]
    deadline = time.monotonic() + 20
    while b"started" not in Path(rec["log"]).read_bytes():  # its one print, before the disk fills
        assert time.monotonic() < deadline
        time.sleep(0.02)
    _fill(small_fs)
    go.touch()  # the job exits 3 now, on a full disk
    ended = _wait_ended(runs, run_id)
    assert ended["state"] == "exited" and ended["exit_code"] == 3, ended
    assert ended["disk_full"] is True
    assert ended["write_error"] == f"no space left on device in {runs / run_id}"
    # what the user sees: `runs` and the dashboard's rows
    state = state_of(_cfg(tmp_path), [RunRecord.parse(ended)])
    (row,) = view.run_rows(state, time.time(), state.runs)
    assert row.state == "failed" and row.exit == "3"
    assert row.note == f"disk full: no space left on device in {runs / run_id}"
    assert "lost" not in format_runs(state)


def _lost_run(fs: Path) -> tuple[Path, Path]:
    """A run dir on `fs` whose manifest names processes that are gone (no exit recorded):
    the runs dir and the run dir."""
    runs = fs / "runs"
    d = runs / "20260101-000000-lost"
    d.mkdir(parents=True, mode=0o700)
    (d / "manifest.json").write_text(json.dumps({
        "run_id": d.name, "name": "full", "argv": ["x"], "pid": 2 ** 22 - 7, "start_ticks": 1,
        "shim_pid": 2 ** 22 - 8, "shim_start_ticks": 1, "boot_time": 0, "launched_at": time.time() - 5}))
    return runs, d


def test_a_run_lost_on_a_full_disk_says_disk_full(small_fs: Path, tmp_path: Path) -> None:
    """No reserve either (the shim died, or the disk was full at launch): the run is not
    alive and has no end recorded, and its filesystem is full: "disk full", not "lost"."""
    runs, d = _lost_run(small_fs)
    _fill(small_fs)
    (rec,) = rundir.list_runs(str(runs))
    assert rec["state"] == "lost" and rec["disk_full"] is True
    assert f"no space left on device in {d}" in rec["write_error"]
    state = state_of(_cfg(tmp_path), [RunRecord.parse(rec)])
    (row,) = view.run_rows(state, time.time(), state.runs)
    assert row.state == "disk full" and row.note.startswith("disk full: no space left on device")
    assert " lost " not in format_runs(state)


def test_a_run_lost_on_a_nearly_full_disk_says_disk_full(small_fs: Path) -> None:
    """A filesystem with a few KiB left is full for a run's records (a new file needs a
    block, a journal, an inode; ENOSPC comes before the last byte): the lost run is
    explained as "disk full" there too, not only at exactly zero bytes free."""
    runs, d = _lost_run(small_fs)
    _fill(small_fs)
    filler = small_fs / "filler"
    os.truncate(filler, filler.stat().st_size - 16 * 1024)
    st = os.statvfs(small_fs)
    assert 0 < st.f_bavail * st.f_frsize < 64 * 1024
    (rec,) = rundir.list_runs(str(runs))
    assert rec["state"] == "lost" and rec["disk_full"] is True
    os.truncate(filler, 0)  # room again: the same run is plainly lost
    (rec,) = rundir.list_runs(str(runs))
    assert rec["state"] == "lost" and rec["disk_full"] is False


# ---- a launch onto a full disk: one clear line, a failed record, nothing left running

SLEEPER = "import time; time.sleep(60)"  # writes nothing: the pages below are the records'
PAGE = 4096  # tmpfs counts its space in pages: each record below takes one


def _leave_free(fs: Path, pages: int) -> None:
    """Fill `fs`, then free exactly `pages` pages of it."""
    _fill(fs)
    filler = fs / "filler"
    used = -(-filler.stat().st_size // PAGE)
    os.truncate(filler, (used - pages) * PAGE)
    st = os.statvfs(fs)
    assert st.f_bavail * st.f_frsize == pages * PAGE, (st.f_bavail, st.f_frsize)


def _marked(run_id: str) -> list[int]:
    """Live processes carrying the run's marker."""
    return [p for p in procfs.list_pids() if procfs.run_marker(p, rundir.RUN_ENV) == run_id
            and (procfs.read_stat(p) or {}).get("state") not in (None, "Z", "X")]


@pytest.mark.parametrize(("pages", "record"), [(0, "launch.json"), (1, rundir.EXIT_RESERVE)])
def test_a_launch_with_no_room_for_its_records_fails_in_one_line_before_anything_starts(
        small_fs: Path, tmp_path: Path, pages: int, record: str) -> None:
    """No room for the request (0 pages), or for the exit record's reserve after it (1
    page): the launch says so in one line, naming the runs dir (the run's own is removed)
    and the file, and nothing is started or left behind (no run dir: there is no run)."""
    runs = small_fs / "runs"
    runs.mkdir(mode=0o700)
    _leave_free(small_fs, pages)
    with pytest.raises(rundir.RunnerError) as err:
        launch.launch(str(runs), "full", [sys.executable, "-c", SLEEPER], str(tmp_path), {})
    assert str(err.value) == (f"cannot launch: no space left on device in {runs} "
                              f"(writing the run's {record}; nothing was started)"), err.value
    assert sorted(os.listdir(runs)) == [".launch.lock"]
    assert rundir.list_runs(str(runs)) == []


def test_a_run_whose_manifest_finds_no_room_is_stopped_and_listed_failed_with_why(
        small_fs: Path, tmp_path: Path) -> None:
    """Room for the request and the reserve, none for the manifest (the disk filled as
    the shim started the command): the shim stops the command and reaps it (no process
    of the run is left running unrecorded), and writes why into the reserve, as
    error.json; the launch reports it, and `runs` and the dashboard list the run failed
    with that reason."""
    runs = small_fs / "runs"
    runs.mkdir(mode=0o700)
    _leave_free(small_fs, 2)
    with pytest.raises(rundir.RunnerError) as err:
        launch.launch(str(runs), "full", [sys.executable, "-c", SLEEPER], str(tmp_path), {})
    (run_id,) = [n for n in os.listdir(runs) if not n.startswith(".")]
    try:
        why = f"no space left on device writing {runs / run_id / 'manifest.json'}; its command was stopped"
        assert str(err.value) == f"run {run_id} did not start: {why}"
        (rec,) = rundir.list_runs(str(runs))
        assert rec["state"] == "failed" and rec["error"] == why, rec
        assert not (runs / run_id / rundir.EXIT_RESERVE).exists()  # it became error.json
        deadline = time.monotonic() + 10  # the shim exits once its record is written
        while _marked(run_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _marked(run_id) == []
        state = state_of(_cfg(tmp_path), [RunRecord.parse(rec)])
        (row,) = view.run_rows(state, time.time(), state.runs)
        assert row.state == "failed" and row.note == f"did not start: {why}"
        assert why in format_runs(state)
    finally:
        for pid in _marked(run_id):  # the old shim left its command running: end it here
            os.kill(pid, 9)


PACED = """\
import os, sys, time
for n, go in enumerate(sys.argv[1:]):
    print("line", n, flush=True)
    while not os.path.exists(go):
        time.sleep(0.02)
"""


def test_the_pace_thread_outlives_a_full_disk(small_fs: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """pace.json cannot be written while the disk is full; once there is room again it
    is (the pace thread kept going, it did not end at the first ENOSPC)."""
    monkeypatch.setenv("EAGLE3_TUI_PACE_S", "0.1")
    monkeypatch.setenv("EAGLE3_TUI_GPU_SOURCE", "none")
    runs, go = small_fs / "runs", [tmp_path / f"go{i}" for i in range(3)]
    rec = launch.launch(str(runs), "paced", [sys.executable, "-c", PACED, *map(str, go)], str(tmp_path), {},
                        log=str(tmp_path / "out.log"))  # the log has room: only the records lack it
    pace_json = runs / rec["run_id"] / "pace.json"

    def lines(want: int, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = (rundir.read_json(str(pace_json)) or {}).get("lines")
            if got == want:
                break
            time.sleep(0.05)
        return got

    try:
        assert lines(1) == 1
        _fill(small_fs)
        go[0].touch()  # a second line, on a full disk: pace.json stays as it was
        assert lines(2, timeout=1.0) == 1
        (small_fs / "filler").unlink()
        go[1].touch()  # room again, and a third line
        assert lines(3) == 3
    finally:  # the job ends whatever failed above: no process left waiting for a go file
        for g in go:
            g.touch()
    assert _wait_ended(runs, rec["run_id"])["exit_code"] == 0


def test_why_a_run_could_not_start_is_kept_on_a_full_disk(small_fs: Path, tmp_path: Path) -> None:
    """The command cannot start (its log is a FIFO: refused) and the disk has no room for
    error.json: the reason goes into the reserve the launch made, so the launch and
    `runs` still say why."""
    runs = small_fs / "runs"
    runs.mkdir(mode=0o700)
    os.mkfifo(tmp_path / "fifo")
    _leave_free(small_fs, 2)
    with pytest.raises(rundir.RunnerError, match="did not start: refusing log .*fifo"):
        launch.launch(str(runs), "full", [sys.executable, "-c", SLEEPER], str(tmp_path), {},
                      log=str(tmp_path / "fifo"))
    (rec,) = rundir.list_runs(str(runs))
    assert rec["state"] == "failed" and rec["error"].startswith("refusing log "), rec


def test_no_inode_left_for_the_run_dir_is_one_line(small_fs: Path, tmp_path: Path) -> None:
    """No room for the run dir itself (no inode left: mkdir's ENOSPC): one line too."""
    # A tmpfs of 16 inodes of its own (on the small one, which takes it down with it): a
    # remount with nr_inodes is refused in a user namespace, where a normal user runs this.
    tight = small_fs / "tight"
    tight.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=16,mode=0700", "tmpfs", str(tight)], check=True)
    runs = tight / "runs"
    runs.mkdir(mode=0o700)
    (runs / ".launch.lock").touch(mode=0o600)
    with pytest.raises(OSError) as full:
        for n in range(16):
            (tight / f"inode{n}").touch()
    assert full.value.errno == errno.ENOSPC
    with pytest.raises(rundir.RunnerError) as err:
        launch.launch(str(runs), "full", [sys.executable, "-c", SLEEPER], str(tmp_path), {})
    assert re.fullmatch(rf"cannot launch: no space left on device making {runs}/[\w.-]+", str(err.value)), err.value


def test_a_failure_left_in_the_reserve_is_still_listed(tmp_path: Path) -> None:
    """The disk had room for neither error.json nor the reserve's rename: the reason stays
    in the reserve's blocks, and `runs` still lists the run failed with it. A reserve of
    blanks (a launch still starting) lists nothing."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    run_id, run_dir = rundir.new_run_dir(str(runs))
    (Path(run_dir) / "launch.json").write_text(json.dumps({"name": "full", "argv": ["python3"]}))
    os.close(reserve.make(run_dir, rundir.EXIT_RESERVE, rundir.RESERVE_BYTES))
    assert rundir.list_runs(str(runs)) == []
    why = "no space left on device writing manifest.json; its command was stopped"
    record = json.dumps({"error": why, "at": time.time()}).encode()
    (Path(run_dir) / rundir.EXIT_RESERVE).write_bytes(record.ljust(rundir.RESERVE_BYTES - 1) + b"\n")
    (rec,) = rundir.list_runs(str(runs))
    assert rec["run_id"] == run_id and rec["state"] == "failed" and rec["error"] == why, rec


# ---- the restart supervisor on a full disk: the run's attempts and their story kept

CRASH_ONCE = """\
import os, sys, time
d = sys.argv[1]
n = len([f for f in os.listdir(d) if f.startswith("began")]) + 1
open(os.path.join(d, "began%d" % n), "w").close()
print("attempt", n, flush=True)
while not os.path.exists(os.path.join(d, "go%d" % n)):
    time.sleep(0.02)
if n == 1:  # a transient failure the policy restarts
    print("[rank0]:[E1201 03:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
          "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
          flush=True)
    sys.exit(1)
"""
RESTART = '[run]\nrestart = "on-failure"\nrestart_delay = 0.2\nrestart_delay_max = 1\ngraces = [0.5, 0.5]\n'


def _restartable(runs: Path, tmp_path: Path) -> tuple[str, Path]:
    """A run under a restart policy whose attempt 1 dies of an NCCL timeout once
    `tmp_path/go1` exists and whose attempt 2 finishes once `go2` does; its log, and the
    job's files, in `tmp_path` (room there: only the run's records lack it). Its id and
    its working dir."""
    from tui.services.config import parse_config
    from tui.services.restartpolicy import compile_policy

    work = tmp_path / "work"
    work.mkdir()
    rec = launch.launch(str(runs), "restarted", [sys.executable, "-c", CRASH_ONCE, str(work)], str(tmp_path), {},
                        log=str(tmp_path / "out.log"), restart=compile_policy(parse_config(RESTART)))
    return rec["run_id"], work


def _until(pred, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return got


def test_a_restart_on_a_full_disk_goes_on_and_its_attempts_are_listed_with_why(
        small_fs: Path, tmp_path: Path) -> None:
    """The disk fills during attempt 1: the attempt dies, the policy restarts it and
    attempt 2 finishes, though no attempts.json could be written since. The good
    attempts.json of before is left whole (never a half-written one), the run ends with
    its own exit code (0), and `runs` and the dashboard list both attempts, the restart
    and why the record was not written: "no space left on device writing …/attempts.json"."""
    runs = small_fs / "runs"
    run_id, work = _restartable(runs, tmp_path)
    run_dir = runs / run_id
    try:
        _until(lambda: (work / "began1").exists())
        _until(lambda: (rundir.read_json(str(run_dir / "attempts.json")) or {}).get("attempts", [{}])[0].get("pid"))
        before = (run_dir / "attempts.json").read_bytes()
        _fill(small_fs)
        (work / "go1").touch()
        _until(lambda: (work / "began2").exists())
        (work / "go2").touch()
        ended = _wait_ended(runs, run_id)
    finally:
        for n in (1, 2):
            (work / f"go{n}").touch()
    assert (ended["state"], ended["exit_code"], ended["signal"]) == ("exited", 0, None), ended
    assert (run_dir / "attempts.json").read_bytes() == before  # the good one, as it was
    assert ended["disk_full"] is True
    assert ended["write_error"] == f"no space left on device writing {run_dir / 'attempts.json'}"
    assert ended["restarts"] == 1 and ended["restart_note"] == "finished"
    first, second = ended["attempts"]
    assert (first["exit_code"], first["cause"]["id"], first["restarted"]) == (1, "nccl-timeout", True)
    assert (second["exit_code"], second["why"]) == (0, "finished")
    state = state_of(_cfg(tmp_path), [RunRecord.parse(ended)])
    (row,) = view.run_rows(state, time.time(), state.runs)
    assert row.state == "exited" and row.exit == "0"
    assert row.note == ("restarted 1× — last: NCCL collective timed out at log line 2; "
                        f"disk full: no space left on device writing {run_dir / 'attempts.json'}"), row.note
    assert f"writing {run_dir / 'attempts.json'}" in format_runs(state)  # `runs` says it too
    assert "Traceback" not in (tmp_path / "out.log").read_text()


def test_attempts_json_is_written_again_once_the_disk_has_room(small_fs: Path, tmp_path: Path) -> None:
    """The disk is full while attempt 1 ends and attempt 2 starts, then has room again
    while attempt 2 runs: attempts.json is written again within the retry period, with
    both attempts, and the run's record no longer says the disk is full."""
    runs = small_fs / "runs"
    run_id, work = _restartable(runs, tmp_path)
    path = runs / run_id / "attempts.json"
    try:
        _until(lambda: (work / "began1").exists())
        _fill(small_fs)
        (work / "go1").touch()
        _until(lambda: (work / "began2").exists())
        time.sleep(0.5)  # attempt 2's start was recorded, in the reserve
        rec = next(r for r in rundir.list_runs(str(runs)) if r["run_id"] == run_id)
        assert rec["state"] == "running" and rec["disk_full"] is True and len(rec["attempts"]) == 2, rec
        (small_fs / "filler").unlink()
        _until(lambda: len((rundir.read_json(str(path)) or {}).get("attempts", [])) == 2, timeout=15.0)
        rec = next(r for r in rundir.list_runs(str(runs)) if r["run_id"] == run_id)
        assert rec["write_error"] is None and rec["disk_full"] is False and rec["restarts"] == 1, rec
    finally:
        for n in (1, 2):
            (work / f"go{n}").touch()
    ended = _wait_ended(runs, run_id)
    assert (ended["exit_code"], ended["restarts"], ended["write_error"]) == (0, 1, None), ended


def test_a_launch_under_a_policy_with_no_room_for_its_attempts_reserve_fails_in_one_line(
        small_fs: Path, tmp_path: Path) -> None:
    """Room for launch.json and exit.reserve, not for attempts.reserve (16 pages): the
    launch under a restart policy fails in one line naming it, and leaves nothing."""
    from tui.services.config import parse_config
    from tui.services.restartpolicy import compile_policy

    runs = small_fs / "runs"
    runs.mkdir(mode=0o700)
    policy, argv = compile_policy(parse_config(RESTART)), [sys.executable, "-c", SLEEPER]
    # launch.json carries the policy (its signatures: several pages): padded to the middle
    # of a page, so the request's few varying bytes never change its page count
    size = len(json.dumps({"restart": policy, "argv": argv, "cwd": str(tmp_path), "name": "full"}, indent=1)) + 300
    env = {"PAD": "x" * ((PAGE // 2 - size) % PAGE)}
    _leave_free(small_fs, -(-(size + len(env["PAD"])) // PAGE) + 1 + 15)
    with pytest.raises(rundir.RunnerError) as err:
        launch.launch(str(runs), "full", argv, str(tmp_path), env, restart=policy)
    assert str(err.value) == (f"cannot launch: no space left on device in {runs} "
                              "(writing the run's attempts.reserve; nothing was started)"), err.value
    assert sorted(os.listdir(runs)) == [".launch.lock"]


def test_a_slurm_submit_with_no_room_for_its_reserve_fails_in_one_line(small_fs: Path, tmp_path: Path) -> None:
    """A Slurm run's exit record gets its space when it is submitted, not when its job
    starts (the disk may be full by then): no room for it, no job, one line."""
    from remote.run import slurm

    runs = small_fs / "runs"
    runs.mkdir(mode=0o700)
    _leave_free(small_fs, 1)
    with pytest.raises(rundir.RunnerError) as err:
        slurm.submit(str(runs), "full", [sys.executable, "-c", SLEEPER], str(tmp_path), {}, {})
    assert str(err.value) == (f"cannot launch: no space left on device in {runs} "
                              "(writing the run's exit.reserve; nothing was started)"), err.value
    assert sorted(os.listdir(runs)) == [".launch.lock"]


def test_a_record_too_big_for_the_attempts_reserve_keeps_the_latest_attempts(tmp_path: Path) -> None:
    """Hundreds of attempts do not fit the reserve's 64 KiB: the oldest are left out
    (counted), the run's restarts and the latest attempts stay, and the reserve is read
    back as the newest record only while its seq is the higher one."""
    from remote.run import attempts

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fd = reserve.make(str(run_dir), attempts.RESERVE, attempts.RESERVE_BYTES)
    try:
        tried = [{"n": n, "why": "restarting: " + "x" * 400, "restarted": True} for n in range(1, 301)]
        attempts.into_reserve(fd, {"restarts": 300, "attempts": tried, "seq": 7, "write_error": "no space"})
    finally:
        os.close(fd)
    assert (run_dir / attempts.RESERVE).stat().st_size == attempts.RESERVE_BYTES
    rec = attempts.load(str(run_dir))
    assert rec is not None and rec["restarts"] == 300 and rec["attempts"][-1]["n"] == 300
    assert rec["left_out"] + len(rec["attempts"]) == 300 and rec["attempts"][0]["n"] == rec["left_out"] + 1
    (run_dir / attempts.FILE).write_text(json.dumps({"attempts": [], "seq": 6}))
    assert attempts.load(str(run_dir))["seq"] == 7  # the file is older: the reserve's record
    (run_dir / attempts.FILE).write_text(json.dumps({"attempts": [], "seq": 8}))
    assert attempts.load(str(run_dir))["seq"] == 8  # written again since: the file's
