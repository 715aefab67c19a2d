"""Trust on the host (remote/base/trust.py): a runs dir, run dir, launch lock or run record
that another user owns or may write, or that is a symlink, is refused with one line
naming the path, its owner and its mode -- through the real agent, with real files
owned by another uid. Another user's planted record never reaches `runs`, `kill` or
`relaunch`; a run launched in the future never wins the default selection; and the
agent's upload directory is checked the same way before the agent is run from it.

The foreign-owner cases chown to `nobody` (or a made-up uid), which needs root: CI runs
the suite as root; as another user they are skipped with that reason."""

from __future__ import annotations

import grp
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.base.procfs import CMDLINE_CUT
from remote.run import rundir
from tests.agent_driver import AgentCallError, AgentProc
from tui.protocol.records import RunRecord
from tui.services.actions import choose_run
from tui.services.config import load_config

NO_GPU = {"EAGLE3_TUI_GPU_SOURCE": "none"}
ROOT_ONLY = pytest.mark.needs_root("trust: files and dirs another user owns (chown to nobody)")
OTHER_UID = 65534  # nobody


def _agent(runs: Path) -> AgentProc:
    return AgentProc(env=NO_GPU, args=["--runs-dir", str(runs)])


def _victim() -> subprocess.Popen[bytes]:
    """A process the planted manifest names: it must survive root's kill."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _plant_run(runs: Path, run_id: str, argv: list[str], pid: int | None = None,
               launched_at: float | None = None) -> Path:
    """A run dir with launch.json + manifest.json, as another user could write it."""
    d = runs / run_id
    d.mkdir(mode=0o755)
    now = time.time() if launched_at is None else launched_at
    req = {"run_id": run_id, "name": "job", "argv": argv, "cwd": "/", "env": {},
           "patch_state": None, "log": None, "launched_at": now}
    (d / "launch.json").write_text(json.dumps(req))
    manifest = dict(req, pid=pid, pgid=pid, sid=pid, start_ticks=None, shim_pid=None,
                    shim_start_ticks=None, boot_time=0, start_time=now, host="h", user="x",
                    subreaper=False, log=str(d / "output.log"))
    (d / "manifest.json").write_text(json.dumps(manifest))
    (d / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": now}))
    return d


def _chown_tree(path: Path, uid: int) -> None:
    for dirpath, dirs, files in os.walk(path):
        os.chown(dirpath, uid, uid)
        for f in files:
            os.chown(os.path.join(dirpath, f), uid, uid)


# ---------------------------------------------------------------- the runs dir


@ROOT_ONLY
@pytest.mark.parametrize("uid", [OTHER_UID, 4242], ids=["nobody", "made-up-uid"])
def test_runs_dir_of_another_user_is_refused_by_runs_launch_and_kill(tmp_path: Path, uid: int) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    _plant_run(runs, "20260101-000000-aaaa", ["touch", str(tmp_path / "pwned")])
    _chown_tree(runs, uid)
    with _agent(runs) as a:
        for op, args in (("runs", {}), ("kill", {"run_id": "20260101-000000-aaaa", "graces": [0, 0]}),
                         ("launch", {"argv": ["true"], "cwd": str(tmp_path)})):
            with pytest.raises(AgentCallError) as info:
                a.call(op, args)
            line = str(info.value)
            assert "\n" not in line
            assert str(runs) in line and f"uid {uid}" in line and "mode 0700" in line, (op, line)
    assert not (tmp_path / "pwned").exists()


def test_world_writable_runs_dir_is_refused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chmod(runs, 0o777)
    with _agent(runs) as a:
        with pytest.raises(AgentCallError,
                           match=r"runs dir .*writable by (group and )?others.*mode 0777 -- run chmod g?o-w "):
            a.call("runs")
        with pytest.raises(AgentCallError, match=r"mode 0777"):
            a.call("launch", {"argv": ["true"], "cwd": str(tmp_path)})
        a.call("configure", {"interval": 0.1})  # the dashboard: the refusal is an error event
        a.wait_for(lambda m: m["type"] == "error" and "mode 0777" in m["message"])
    os.chmod(runs, 0o1777)  # a sticky bit is no excuse: others could still plant run dirs
    with _agent(runs) as a, pytest.raises(AgentCallError, match="mode 1777"):
        a.call("runs")


# ---------------------------------------------------------------- planted records


@ROOT_ONLY
def test_planted_run_record_is_skipped_with_a_warning_and_never_relaunched(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    planted = _plant_run(runs, "20991231-000000-evil", ["touch", str(tmp_path / "pwned")])
    _chown_tree(planted, OTHER_UID)
    mine = _plant_run(runs, "20260101-000000-mine", ["true"], launched_at=time.time() - 60)
    with _agent(runs) as a:
        result = a.call("runs")
        ids = [r["run_id"] for r in result["runs"]]
        assert ids == [mine.name]
        (warning,) = result["warnings"]
        assert str(planted) in warning and "nobody (uid 65534)" in warning and "mode 0755" in warning
        a.call("configure", {"interval": 0.1})  # the dashboard sees it too, once
        a.wait_for(lambda m: m["type"] == "error" and str(planted) in m["message"])
    cfg = load_config_text(tmp_path, "[run]\nname = \"job\"\nargv = [\"true\"]\n")
    chosen = choose_run(cfg, [RunRecord.parse(r) for r in result["runs"]])  # relaunch's default pick
    assert chosen is not None and chosen.run_id == mine.name


@ROOT_ONLY
def test_planted_manifest_in_a_run_dir_never_makes_kill_signal_its_pid(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    victim = _victim()
    try:
        # (a) a run dir owned by another user, (b) our run dir with a foreign manifest,
        # (c) our run dir whose manifest is a symlink to another user's file.
        a_dir = _plant_run(runs, "20260101-000000-aaaa", ["x"], pid=victim.pid)
        _chown_tree(a_dir, OTHER_UID)
        b_dir = _plant_run(runs, "20260101-000000-bbbb", ["x"], pid=victim.pid)
        os.chmod(b_dir, 0o700)
        os.chown(b_dir / "manifest.json", OTHER_UID, OTHER_UID)
        c_dir = _plant_run(runs, "20260101-000000-cccc", ["x"], pid=victim.pid)
        os.chmod(c_dir, 0o700)
        elsewhere = tmp_path / "theirs.json"
        os.replace(c_dir / "manifest.json", elsewhere)
        os.symlink(elsewhere, c_dir / "manifest.json")
        with _agent(runs) as a:
            for d, why in ((a_dir, "not owned by"), (b_dir, "not owned by"), (c_dir, "a symlink")):
                with pytest.raises(AgentCallError, match=why) as info:
                    a.call("kill", {"run_id": d.name, "graces": [0, 0], "gpu_wait": 0})
                assert str(d) in str(info.value)
            assert [r["run_id"] for r in a.call("runs")["runs"]] == []
        assert victim.poll() is None, "the planted pid was signalled"
    finally:
        victim.kill()
        victim.wait()


def test_launch_lock_symlink_is_refused_and_its_target_never_created(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    target = tmp_path / "etc-thing"
    os.symlink(target, runs / ".launch.lock")
    with _agent(runs) as a:
        with pytest.raises(AgentCallError, match=r"refusing launch lock .*\.launch\.lock: a symlink"):
            a.call("launch", {"argv": ["true"], "cwd": str(tmp_path)})
        with pytest.raises(AgentCallError, match="a symlink"):
            a.call("prune", {"keep": 0})
    assert not target.exists() and not os.path.lexists(str(target))


@ROOT_ONLY
def test_launch_lock_of_another_user_is_refused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    lock = runs / ".launch.lock"
    lock.write_bytes(b"")
    os.chown(lock, OTHER_UID, OTHER_UID)
    with _agent(runs) as a, pytest.raises(AgentCallError, match=r"launch lock .*nobody \(uid 65534\)"):
        a.call("launch", {"argv": ["true"], "cwd": str(tmp_path)})


def test_our_own_runs_pass_and_records_are_written_ours_alone(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    old = os.umask(0o002)  # a user-private-group umask must not lock the user out
    try:
        with _agent(runs) as a:
            rec = a.call("launch", {"argv": [sys.executable, "-c", "pass"], "cwd": str(tmp_path)})
            deadline = time.monotonic() + 10
            while a.call("runs")["runs"][0]["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.05)
            result = a.call("runs")
    finally:
        os.umask(old)
    from remote.base import trust

    assert result["warnings"] == [] and result["runs"][0]["state"] == "exited"
    for p in [runs, runs / rec["run_id"], *(runs / rec["run_id"]).iterdir()]:
        assert trust.problem(str(p), os.lstat(p)) is None, p


# ---------------------------------------------------------------- records from the future


def load_config_text(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "eagle3.toml"
    path.write_text(text)
    return load_config(path)


def test_a_run_from_the_future_never_wins_the_default_selection(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    now = time.time()
    _plant_run(runs, "21000101-000000-futr", ["rm", "-rf", "/x"], launched_at=now + 86400 * 365)
    real = _plant_run(runs, "20260101-000000-real", ["true"], launched_at=now - 30)
    _plant_run(runs, "20260101-000000-skew", ["true"], launched_at=now + 5)  # small skew: fine
    records = [RunRecord.parse(r) for r in rundir.list_runs(str(runs))]
    assert records[0].run_id == "21000101-000000-futr"  # listed (and shown), newest first
    cfg = load_config_text(tmp_path, "[run]\nname = \"job\"\nargv = [\"true\"]\n")
    assert choose_run(cfg, records).run_id == "20260101-000000-skew"
    assert choose_run(cfg, [r for r in records if r.run_id != "20260101-000000-skew"]).run_id == real.name
    # chosen only by naming it
    assert choose_run(cfg, records, "21000101-000000-futr").run_id == "21000101-000000-futr"


# ---------------------------------------------------------------- the agent's upload dir


def _agent_rdir(cache: Path) -> Path:
    from tui.transport.bundle import agent_files, agent_sha, default_agent_dir

    return cache / f"agent-{agent_sha(agent_files(default_agent_dir()))[:12]}"


@pytest.mark.ssh
@pytest.mark.parametrize("how", [pytest.param("owned-by-nobody", marks=ROOT_ONLY), "mode-0777",
                                 pytest.param("planted-file", marks=ROOT_ONLY), "symlinked-dir"])
async def test_agent_upload_dir_not_ours_alone_is_refused(sshd, tmp_path: Path, how: str) -> None:  # type: ignore[no-untyped-def]
    from tui.transport import AgentClient, TransportError
    from tui.transport.ssh import SshLink

    cache = tmp_path / "cache"

    def link() -> SshLink:
        return SshLink(sshd.alias, ssh_config=sshd.ssh_config, python=sys.executable,
                       cache_dir=str(cache), connect_timeout=10, runs_dir=str(tmp_path / "runs"))

    client = AgentClient(link(), reconnect=False)  # a good first contact: uploaded, ours alone
    await client.start()
    await client.close()
    rdir = _agent_rdir(cache)
    assert (rdir / ".complete").exists()
    bad = rdir
    if how == "owned-by-nobody":
        _chown_tree(rdir, OTHER_UID)
    elif how == "mode-0777":
        os.chmod(rdir / "remote" / "agent" / "main.py", 0o666)
        bad = rdir / "remote" / "agent" / "main.py"
    elif how == "planted-file":
        bad = rdir / "remote" / "__pycache__" / "wire.cpython-39.pyc"
        bad.parent.mkdir(exist_ok=True)
        bad.write_bytes(b"planted")
        os.chown(bad, OTHER_UID, OTHER_UID)
    else:
        theirs = tmp_path / "theirs"
        os.rename(rdir, theirs)
        os.symlink(theirs, rdir)
    # the agent would print a marker to stdout if it ran: it must not run at all
    (tmp_path / "runs").mkdir(exist_ok=True)
    client = AgentClient(link(), reconnect=False)
    with pytest.raises(TransportError) as info:
        await client.start()
    await client.close()
    line = str(info.value)
    assert "\n" not in line and "refusing to run the agent" in line and str(bad) in line, line
    if how == "owned-by-nobody":
        assert "nobody" in line


def _shared_gid() -> int:
    """A group that is not our private one and that we may give our files (a group
    write of our own private group is ours: a umask of 002 under user-private groups)."""
    from remote.base import trust

    for gid in ([OTHER_UID] if os.geteuid() == 0 else os.getgroups()):
        if not trust.private_group(gid):
            return gid
    pytest.skip("no group but our private one to give a file to")


def test_trust_problem_names_path_owner_and_mode(tmp_path: Path) -> None:
    from remote.base import trust

    p = tmp_path / "f"
    p.write_bytes(b"")
    gid = _shared_gid()
    os.chown(p, -1, gid)
    os.chmod(p, 0o620)
    line = trust.problem(str(p), os.lstat(p), "run record")
    assert line == (f"refusing run record {p}: writable by group; owner "
                    f"{trust.owner_name(os.geteuid())}, mode 0620 -- run chmod g-w {p} (group "
                    f"{grp.getgrgid(gid).gr_name} (gid {gid}) is not yours alone: they could plant files "
                    f"the agent would act on)")
    os.chmod(p, 0o600)
    assert trust.problem(str(p), os.lstat(p)) is None


def test_a_group_writable_record_in_a_sealed_run_dir_is_still_ours(tmp_path: Path) -> None:
    """Records written by an older agent under a umask of 002 (0664) inside a 0700 run dir
    (no one else can enter it) stay listed; the same record in a 0755 run dir does not
    (when its group is shared: the user's private group is the user's own)."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    d = _plant_run(runs, "20260101-000000-old1", ["true"], launched_at=time.time() - 60)
    gid = _shared_gid()
    for f in d.iterdir():
        os.chown(f, -1, gid)
        os.chmod(f, 0o664)
    os.chmod(d, 0o700)
    assert [r["run_id"] for r in rundir.list_runs(str(runs))] == [d.name]
    os.chmod(d, 0o755)
    warnings: list[str] = []
    rundir._ENDED.clear()
    assert rundir.list_runs(str(runs), warnings) == []
    assert "writable by group" in warnings[0] and "mode 0664" in warnings[0]


@pytest.mark.ssh
async def test_our_own_upload_dir_left_group_writable_by_a_umask_of_002_still_starts(sshd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tui.transport import AgentClient
    from tui.transport.ssh import SshLink

    cache = tmp_path / "cache"

    def link() -> SshLink:
        return SshLink(sshd.alias, ssh_config=sshd.ssh_config, python=sys.executable,
                       cache_dir=str(cache), connect_timeout=10, runs_dir=str(tmp_path / "runs"))

    client = AgentClient(link(), reconnect=False)
    await client.start()
    await client.close()
    rdir = _agent_rdir(cache)
    os.chmod(cache, 0o775)
    os.chmod(rdir, 0o775)
    client = AgentClient(link(), reconnect=False)
    await client.start()  # our own dirs: tightened (chmod go-w), not refused
    await client.close()
    assert (cache.stat().st_mode & 0o777, rdir.stat().st_mode & 0o777) == (0o755, 0o755)


def test_the_run_gets_the_login_umask_back_while_the_agent_runs_under_022(tmp_path: Path) -> None:
    """The start command puts the agent under umask 022 (its files stay ours alone) and
    keeps the login's in EAGLE3_TUI_UMASK; the shim gives that back to the run."""
    old = os.umask(0o022)
    try:
        with AgentProc(env=dict(NO_GPU, EAGLE3_TUI_UMASK="0002"), args=["--runs-dir", str(tmp_path / "runs")]) as a:
            rec = a.call("launch", {"argv": [sys.executable, "-c",
                                             "import os; m = os.umask(0); print('umask %o' % m); "
                                             "print('env', 'EAGLE3_TUI_UMASK' in os.environ)"],
                                    "cwd": str(tmp_path)})
            deadline = time.monotonic() + 10
            while "env" not in Path(rec["log"]).read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        os.umask(old)
    assert Path(rec["log"]).read_text().splitlines() == ["umask 2", "env False"]


def test_a_symlink_posing_as_a_run_dir_is_warned_about_and_a_stray_file_is_not(tmp_path: Path) -> None:
    """The runs list names what it refuses: a symlink where a run dir should be (it could
    point anywhere) is a warning; a file a user left in the runs dir is simply not a run."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    (runs / "notes.txt").write_text("which run was the good one")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = runs / "20260101-000000-link"
    link.symlink_to(elsewhere)
    mine = _plant_run(runs, "20260101-000000-mine", ["true"], launched_at=time.time() - 60)
    warnings: list[str] = []
    assert [r["run_id"] for r in rundir.list_runs(str(runs), warnings)] == [mine.name]
    (warning,) = warnings
    assert warning.startswith(f"refusing run dir {link}: a symlink")


@pytest.mark.parametrize("when", ["swapped while followed", "there at subscribe"])
def test_a_log_swapped_for_a_fifo_never_freezes_the_agent(tmp_path: Path, when: str) -> None:
    """An adopted run's log is another user's file: swapped for a FIFO while the agent
    followed it (a "rotation"), the agent's open waited for a writer and every snapshot,
    reply and kill stopped behind it. Now the open never blocks and a FIFO is refused."""
    runs, evil = tmp_path / "runs", tmp_path / "evil"
    runs.mkdir(mode=0o700)
    evil.mkdir()
    log = evil / "out.log"

    def swap() -> None:
        if log.exists():
            log.rename(evil / "out.old")
        os.mkfifo(log)

    if when == "there at subscribe":
        swap()
    else:
        log.write_bytes(b"line one\n")
    with _agent(runs) as agent:
        agent.call("subscribe", {"sub": "log", "path": str(log), "offset": 0})
        if when == "swapped while followed":
            agent.wait_for(lambda m: m.get("type") == "log", what="the log's first bytes")
            swap()
        said = agent.wait_for(lambda m: m.get("type") == "error" and "not a regular file" in m.get("message", ""),
                              what="the refusal of the FIFO")
        assert str(log) in said["message"]
        assert agent.call("snapshot", timeout=5)["seq"] >= 0  # the main loop still turns
        with pytest.raises(AgentCallError, match="not a regular file"):  # the log viewer's read
            agent.call("read_range", {"path": str(log), "offset": 0, "length": 100}, timeout=5)
        assert agent.call("runs", {}, timeout=5) is not None  # still answering


def test_another_users_huge_command_line_is_cut_in_the_snapshot(tmp_path: Path) -> None:
    """A process that matches (or holds a GPU) is in every snapshot with its argv, and in
    the runs as an adopted run: a 2 MB argv (the kernel's limit) made each snapshot
    ~4 MB, once a second, for every dashboard on the host. The agent keeps 32 KiB."""
    marker = "huge-argv-%d" % os.getpid()
    big = "A" * 120_000  # the kernel's limit is 128 KiB an argument, 2 MB in all
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker] + [big] * 12)
    try:
        with _agent(tmp_path / "runs") as agent:
            agent.call("configure", {"interval": 3600, "match": marker})
            deadline = time.monotonic() + 15
            while True:
                snap = agent.call("snapshot")
                mine = [p for p in snap["processes"] if p["pid"] == child.pid]
                if mine or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            (proc,) = mine
            assert proc["cmdline"][:4] == [sys.executable, "-c", "import time; time.sleep(60)", marker]
            assert proc["cmdline"][-1] == CMDLINE_CUT and len("\0".join(proc["cmdline"])) < 33 * 1024
            (ext,) = [r for r in snap["runs"] if r.get("pid") == child.pid]
            assert ext["argv"] == proc["cmdline"]
            assert len(json.dumps(snap)) < 100_000
    finally:
        child.kill()
        child.wait()
