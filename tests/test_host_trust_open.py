"""The host side's one rule for what it opens as the user (remote/base/trust.py `open_file`),
met where it matters most: a run's `[run] log`, which the shim opens in the run's cwd.
As root in a directory another user may write, a symlink named like the log made root
append the run's output to any file (or create one anywhere), a FIFO blocked the shim
until that user read it ("no manifest within 10 s"), and a file of theirs let them add
lines the dashboard took for the run's. Now each is refused up front, by the launch
itself, with one line naming the path, its owner and its mode -- through the real agent.

Also: the run marker is counted by the process's real uid (a setuid-root program another
user starts is owned by root in /proc), and a runs dir made by the user's own hand under
a umask of 002 (user-private group) is accepted while a shared group's write is refused
with what to run. The foreign-owner cases chown to `nobody`, which needs root (CI runs
the suite as root)."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from remote.agent import proctable
from remote.base import procfs, trust
from remote.run import kill as killer
from remote.run import restart, rundir
from tests import checkout
from tests.agent_driver import AgentCallError, AgentProc

NO_GPU = {"EAGLE3_TUI_GPU_SOURCE": "none"}
ROOT_ONLY = pytest.mark.needs_root(
    "trust: logs, cwds, symlinks and processes of another user (chown, setuid to nobody)")
NOBODY = 65534
SECRET = b"root's own line\n"


def _theirs(tmp_path: Path) -> Path:
    """A directory of another user (nobody), where they may plant anything."""
    d = tmp_path / "theirs"
    d.mkdir(mode=0o755)
    os.chown(d, NOBODY, NOBODY)
    return d


def _secret(tmp_path: Path) -> Path:
    s = tmp_path / "root-only"
    s.write_bytes(SECRET)
    os.chmod(s, 0o600)
    return s


def _plant(case: str, cwd: Path, tmp_path: Path) -> Path:
    """Put `case` where the run's log goes (cwd/output.log), as nobody would."""
    log = cwd / "output.log"
    if case == "symlink to a root 0600 file":
        os.symlink(_secret(tmp_path), log)
    elif case == "dangling symlink":
        os.symlink(tmp_path / "created-by-root", log)
    elif case in ("FIFO, no reader", "FIFO, read by them"):
        os.mkfifo(log, 0o666)
    elif case == "file they own":
        log.write_bytes(b"their line\n")
        os.chmod(log, 0o644)
    elif case == "hard link to a root file":
        os.link(_secret(tmp_path), log)
    if os.path.lexists(log):
        os.lchown(log, NOBODY, NOBODY)
    return log


CASES = {  # case -> what the one-line refusal must say
    "symlink to a root 0600 file": "a symlink, not owned by root (uid 0); owner nobody (uid 65534), mode 0777",
    "dangling symlink": "a symlink, not owned by root (uid 0); owner nobody (uid 65534), mode 0777",
    "FIFO, no reader": "a FIFO, not a regular file; owner nobody (uid 65534)",
    "FIFO, read by them": "a FIFO, not a regular file; owner nobody (uid 65534)",
    "file they own": "not owned by root (uid 0); owner nobody (uid 65534), mode 0644",
    "hard link to a root file": "hard links",
}


@ROOT_ONLY
@pytest.mark.parametrize("case", list(CASES))
def test_a_planted_log_in_another_users_directory_fails_the_launch_up_front(tmp_path: Path, case: str) -> None:
    cwd = _theirs(tmp_path)
    log = _plant(case, cwd, tmp_path)
    if case == "hard link to a root file":
        os.chown(log, 0, 0)  # the link is the root file itself
    reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK) if case == "FIFO, read by them" else None
    runs = tmp_path / "runs"
    try:
        with AgentProc(env=NO_GPU, args=["--runs-dir", str(runs)]) as a:
            started = time.monotonic()
            with pytest.raises(AgentCallError) as info:
                a.call("launch", {"argv": [sys.executable, "-c", "print('the run line')"], "cwd": str(cwd),
                                  "log": "output.log"}, timeout=30)
            took = time.monotonic() - started
            line = str(info.value)
            assert "\n" not in line and f"refusing log {log}: " in line and CASES[case] in line, line
            assert took < 5, "the refusal took %.1f s (the launch waits 10 s for a manifest)" % took
            assert a.call("runs")["runs"][0]["state"] == "failed"  # listed, with the same line
        if reader is not None:
            try:
                got = os.read(reader, 100)
            except BlockingIOError:
                got = b""
            assert got == b"", "the run's output went into their FIFO"
    finally:
        if reader is not None:
            os.close(reader)
    if case in ("symlink to a root 0600 file", "hard link to a root file"):
        assert (tmp_path / "root-only").read_bytes() == SECRET
    assert not os.path.lexists(tmp_path / "created-by-root")
    if case == "file they own":
        assert log.read_bytes() == b"their line\n"


@ROOT_ONLY
def test_a_cwd_reached_through_their_symlink_is_refused_and_a_fresh_log_in_their_directory_is_ours(
        tmp_path: Path) -> None:
    """A symlink on the way (their dir holds it: they could point it anywhere) is refused;
    a log that does not exist yet is created by root, root's and 0644, and the run works."""
    theirs = _theirs(tmp_path)
    target = tmp_path / "etc-like"
    target.mkdir(mode=0o700)
    os.symlink(target, theirs / "proj")
    os.lchown(theirs / "proj", NOBODY, NOBODY)
    runs = tmp_path / "runs"
    old = os.umask(0o002)
    try:
        with AgentProc(env=NO_GPU, args=["--runs-dir", str(runs)]) as a:
            with pytest.raises(AgentCallError, match=r"refusing log .*proj/output.log: on its path, "
                                                     r"/.*/theirs/proj is a "
                                                     r"symlink in a directory that is not yours or root's alone "
                                                     r"\(owner nobody \(uid 65534\), mode 0755\)"):
                a.call("launch", {"argv": ["true"], "cwd": str(theirs / "proj"), "log": "output.log"})
            assert not (target / "output.log").exists()
            rec = a.call("launch", {"argv": [sys.executable, "-c", "print('the run line')"], "cwd": str(theirs),
                                    "log": "output.log"})
            deadline = time.monotonic() + 10
            while a.call("runs")["runs"][0]["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        os.umask(old)
    st = os.lstat(theirs / "output.log")
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644) and rec["log"] == str(theirs / "output.log")
    assert (theirs / "output.log").read_text() == "the run line\n"


def test_open_file_never_blocks_on_a_fifo_nor_follows_a_symlink(tmp_path: Path) -> None:
    """The rule itself, as any user: a FIFO is refused at once (read or write, with or
    without a reader), a symlink is refused whoever owns it, and O_TRUNC waits for the
    checks (a refused file is never emptied)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    for flags in (os.O_RDONLY, os.O_WRONLY | os.O_APPEND | os.O_CREAT):
        started = time.monotonic()
        with pytest.raises(trust.Untrusted, match="a FIFO, not a regular file"):
            trust.open_file(str(fifo), flags, "log")
        assert time.monotonic() - started < 1
    mine = tmp_path / "mine"
    mine.write_bytes(b"keep")
    os.symlink(mine, tmp_path / "link")
    with pytest.raises(trust.Untrusted, match="link: a symlink"):
        trust.open_file(str(tmp_path / "link"), os.O_WRONLY | os.O_TRUNC, "log")
    assert mine.read_bytes() == b"keep"
    (tmp_path / "open").mkdir(mode=0o755)  # not sealed: a 0700 dir of ours makes its files' bits moot
    mine = mine.rename(tmp_path / "open" / "mine")
    os.chmod(mine, 0o646)
    with pytest.raises(trust.Untrusted, match=r"writable by others.* -- run chmod o-w "):
        trust.open_file(str(mine), os.O_WRONLY | os.O_TRUNC, "log")
    assert mine.read_bytes() == b"keep"
    fd = trust.open_file(str(tmp_path / "new.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, "log", 0o644)
    try:
        assert os.get_blocking(fd) and os.fstat(fd).st_mode & 0o777 == 0o644 & ~os.umask(os.umask(0))
    finally:
        os.close(fd)


def test_a_symlink_in_a_directory_of_ours_is_followed(tmp_path: Path) -> None:
    """Our own links keep working (a ~/.cache moved to a data disk): a symlink in a
    directory only we (or root) may change is followed, `..` included."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "via").symlink_to(real)
    trust.make_dir(str(tmp_path / "via" / "runs"), "runs dir")
    assert (real / "runs").is_dir()
    os.close(trust.open_file(str(tmp_path / "via" / "runs" / ".." / "runs" / "x"), os.O_WRONLY | os.O_CREAT))
    assert (real / "runs" / "x").is_file()


@ROOT_ONLY
def test_in_a_sticky_directory_only_our_own_or_roots_symlink_is_followed(tmp_path: Path) -> None:
    """/tmp-like (1777, root's): another user's link there is refused, ours is followed."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (sticky / "ours").symlink_to(real)
    (sticky / "theirs").symlink_to(real)
    os.lchown(sticky / "theirs", NOBODY, NOBODY)
    os.close(trust.open_file(str(sticky / "ours" / "x"), os.O_WRONLY | os.O_CREAT))
    with pytest.raises(trust.Untrusted, match=r"on its path, .*/sticky/theirs is a symlink .*mode 1777"):
        trust.open_file(str(sticky / "theirs" / "y"), os.O_WRONLY | os.O_CREAT, "log")
    assert sorted(os.listdir(real)) == ["x"]


# ---------------------------------------------------------------- the run marker's real uid


def _setuid_copy(program: str) -> tuple[str, str]:
    """A setuid-root copy of `program` in a temp dir anyone may enter: (dir, path)."""
    d = tempfile.mkdtemp(prefix="e3-setuid-")
    os.chmod(d, 0o755)
    path = os.path.join(d, os.path.basename(program))
    shutil.copy(program, path)
    os.chown(path, 0, 0)
    os.chmod(path, 0o4755)
    return d, path


@ROOT_ONLY
def test_a_setuid_program_another_user_starts_with_the_marker_is_not_the_runs(tmp_path: Path) -> None:
    """`EAGLE3_TUI_RUN_ID=<root's run> <setuid-root program>` run by nobody: /proc/PID is
    root's (the effective uid), its real uid is nobody's. Neither the process table nor
    root's kill takes it for the run's (the owner of /proc/PID did)."""
    runs = str(tmp_path / "runs")
    from remote.run import runner

    rec = runner.launch(runs, "svc", [sys.executable, "-c", "import time; time.sleep(60)"], str(tmp_path), {})
    d, sleeper = _setuid_copy(shutil.which("sleep") or "/bin/sleep")

    def as_nobody() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    stranger = subprocess.Popen([sleeper, "60"], cwd="/", preexec_fn=as_nobody, start_new_session=True,
                                env={"PATH": "/usr/bin:/bin", rundir.RUN_ENV: rec["run_id"]})
    try:
        deadline = time.monotonic() + 10
        while procfs.read_environ_var(stranger.pid, rundir.RUN_ENV) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert procfs.read_uid(stranger.pid) == 0, "the setuid bit did not take (a nosuid mount?)"
        assert procfs.read_real_uid(stranger.pid) == NOBODY
        assert procfs.run_marker(stranger.pid, rundir.RUN_ENV) is None
        rows = {r["pid"]: r for r in proctable.ProcTable(rundir.RUN_ENV).sample(
            None, {"sid": {}, "pgid": {}}, {stranger.pid})}
        assert rows[stranger.pid]["run_id"] is None and "run" not in rows[stranger.pid]["why"]
        # nor the restart supervisor's "leftovers of an attempt", which it SIGKILLs
        sup = restart.Supervisor.__new__(restart.Supervisor)  # _others needs only the run id
        sup.run_id = rec["run_id"]
        assert stranger.pid not in sup._others()
        report = killer.kill(runs, rec["run_id"], graces=(0.5, 0.5), gpu_wait=0)
        assert report["ok"] is True
        assert stranger.pid not in sum((s["sent_to"] for s in report["stages"]), [])
        assert stranger.poll() is None, "root's kill signalled another user's process"
    finally:
        stranger.kill()
        stranger.wait()
        shutil.rmtree(d)


# ---------------------------------------------------------------- umask 002, private groups


def _shared_gid() -> int | None:
    """A group that is not our private one and that we may give our files, or None."""
    if os.geteuid() == 0:
        return NOBODY if not trust.private_group(NOBODY) else None
    for gid in os.getgroups():
        if not trust.private_group(gid):
            return gid
    return None


def test_a_runs_dir_made_by_hand_under_umask_002_is_ours_and_a_shared_groups_write_is_not(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.geteuid())
    if not trust.private_group(me.pw_gid):
        pytest.skip(f"{me.pw_name}'s primary group {me.pw_gid} is shared here: no private group to test")
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chmod(runs, 0o775)  # what `mkdir runs` does under umask 002
    assert rundir.check_runs_dir(str(runs)) is True
    gid = _shared_gid()
    if gid is None:
        return
    os.chown(runs, -1, gid)
    name = grp.getgrgid(gid).gr_name
    with pytest.raises(rundir.RunnerError) as info:
        rundir.check_runs_dir(str(runs))
    assert str(info.value) == (
        f"refusing runs dir {runs}: writable by group; owner {trust.owner_name(os.geteuid())}, mode 0775"
        f" -- run chmod g-w {runs} (group {name} (gid {gid}) is not yours alone: they could plant files "
        f"the agent would act on)")


def test_private_group_is_the_users_alone() -> None:
    me = pwd.getpwuid(os.geteuid())
    members = [p.pw_name for p in pwd.getpwall() if p.pw_gid == me.pw_gid and p.pw_uid != me.pw_uid]
    grmem = [m for m in grp.getgrgid(me.pw_gid).gr_mem if m != me.pw_name]
    assert trust.private_group(me.pw_gid) is (not members and not grmem)
    assert trust.private_group(me.pw_gid, NOBODY if me.pw_uid != NOBODY else 0) is False or me.pw_gid == NOBODY


@pytest.mark.parametrize("mask", [0o002, 0o022, 0o077])
def test_everything_the_agent_creates_has_its_own_mode_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    """The agent under the login's umask (a local link passes it on): the runs dir and
    every level above it that it makes, the actions dir, each run dir and record, the
    timeline and the log are never group- or other-writable, so 002 never locks out."""
    runs = tmp_path / "a" / "b" / "runs"
    old = os.umask(mask)
    try:
        with AgentProc(env=NO_GPU, args=["--runs-dir", str(runs)]) as a:
            rec = a.call("launch", {"argv": [sys.executable, "-c", "print('x')"], "cwd": str(tmp_path),
                                    "action": "act-1"})  # its outcome record comes first: RUNS/.actions
            deadline = time.monotonic() + 10
            while a.call("runs")["runs"][0]["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.05)
            result = a.call("runs")
    finally:
        os.umask(old)
    assert result["warnings"] == [] and result["runs"][0]["state"] == "exited", result
    made = [tmp_path / "a", tmp_path / "a" / "b", runs, *runs.rglob("*"), Path(rec["log"])]
    loose = {str(p): oct(os.lstat(p).st_mode & 0o777) for p in made if os.lstat(p).st_mode & 0o022}
    assert loose == {}
    assert all(os.lstat(p).st_mode & 0o777 == 0o700 for p in made if p.is_dir())


def test_open_file_refuses_a_group_or_world_writable_mode_for_what_it_creates(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        trust.open_file(str(tmp_path / "x"), os.O_WRONLY | os.O_CREAT, "log", 0o664)
    assert not (tmp_path / "x").exists()


def test_the_host_never_blocks_on_a_log_swapped_for_a_fifo_after_launch(tmp_path: Path) -> None:
    """The restart supervisor reads the end of an attempt's log for its root cause: a log
    replaced by a FIFO after the launch (by the job, or by anyone who may write its
    directory) blocked it in open() for good, and the run never ended. Now the read is
    refused at once, the attempt is decided without a cause, and the run ends."""
    tail = trust.read_tail
    log = tmp_path / "job.log"
    log.write_bytes(b"a" * 10 + b"the end\n")
    assert tail(str(log), 0, 8) == b"the end\n" and tail(str(log), 14, 100) == b"end\n"
    os.unlink(log)
    os.mkfifo(log, 0o600)
    started = time.monotonic()
    with pytest.raises(trust.Untrusted, match="a FIFO"):
        tail(str(log), 0, 100)
    assert time.monotonic() - started < 1
    os.unlink(log)
    job = tmp_path / "job.py"
    job.write_text(f"import os\nprint('working', flush=True)\nos.unlink({str(log)!r})\nos.mkfifo({str(log)!r})\n"
                   "raise SystemExit(1)\n")
    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\n'
        f'[run]\ncommand = ["{sys.executable}", "{job}"]\ncwd = "{tmp_path}"\nlog = "{log}"\n'
        'restart = "on-failure"\nmax_restarts = 1\nrestart_delay = 0.2\n')
    env = checkout.env(EAGLE3_TUI_GPU_SOURCE="none")
    e3 = [sys.executable, "-m", "tui.cli", "--config", str(tmp_path / "eagle3.toml")]
    out = subprocess.run([*e3, "launch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        runs = subprocess.run([*e3, "runs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        if "running" not in runs.stdout and "waiting" not in runs.stdout and "failed" in runs.stdout:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the run never ended: " + runs.stdout + runs.stderr)
