"""First contact: every first mistake gets one clear line and the right exit code.

Against the real things: a second OpenSSH sshd without an SFTP subsystem, a login whose
`python3` is 3.8, the real CLI as a process with and without a terminal, real venvs.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import checkout
from tests.sshd import Sshd
from tui.transport import AgentClient
from tui.transport.ssh import SshLink

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.ssh


def cli(*args: str, cwd: Path | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    kw.setdefault("env", checkout.env())  # this checkout's tui, from any cwd
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


def one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


# ---- hosts without SFTP ------------------------------------------------------------


def test_agent_upload_falls_back_to_exec_without_sftp(tmp_path: Path) -> None:
    with Sshd(tmp_path / "sshd", sftp=False) as srv:
        link = SshLink(srv.alias, ssh_config=srv.ssh_config, cache_dir=str(tmp_path / "cache"))

        async def twice() -> tuple[str, str]:
            client = AgentClient(link, reconnect=False)
            hello = await client.start()
            await client.close()
            client = AgentClient(link, reconnect=False)
            again = await client.start()  # uploaded already: nothing is sent again
            await client.close()
            return hello.python, again.python

        python, _ = asyncio.run(twice())
        assert python.startswith(f"{sys.version_info[0]}.")
        assert link.uploads == 1
        assert link.notice is not None
        assert "SFTP unavailable" in link.notice and "Session request failed" in link.notice
        rdir = Path(link.remote_dir or "")
        assert (rdir / ".complete").is_file()
        for name in ("__init__.py", "agent/main.py", "run/__init__.py", "run/runner.py", "run/kill.py"):  # its shape
            assert (rdir / "remote" / name).read_bytes() == (ROOT / "remote" / name).read_bytes()
        assert not list(rdir.glob("**/.*.tmp-*"))  # atomic writes leave no temp files


def test_no_sftp_and_a_failing_exec_fallback_names_both(tmp_path: Path) -> None:
    with Sshd(tmp_path / "sshd", sftp=False) as srv:
        # /proc refuses new directories, so the exec upload fails too.
        link = SshLink(srv.alias, ssh_config=srv.ssh_config, cache_dir="/proc/eagle3-no")

        async def start() -> str:
            client = AgentClient(link, reconnect=False)
            try:
                await client.start()
            except Exception as exc:  # noqa: BLE001 - the message is what is tested
                return str(exc)
            finally:
                await client.close()
            return "started"

        msg = asyncio.run(start())
    assert "SFTP refused (Session request failed)" in msg
    assert "exec fallback failed (" in msg and "\n" not in msg


# ---- the host's Python --------------------------------------------------------------


def old_python_login(bindir: Path, newer: str | None = None) -> dict[str, str]:
    """A login whose `python3` answers the version probe as Python 3.8.10 would, and whose
    python3.9 … python3.14 do not run (except `newer`, a real one, when given). Returns
    the session environment for Sshd: that directory first on PATH (PYENV_VERSION=system
    keeps a pyenv set up in the login's shell rc from answering instead)."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name in ("python3", *(f"python3.{x}" for x in range(9, 15))):
        script = bindir / name
        if name == newer:
            os.symlink(sys.executable, script)
            continue
        body = "echo '3.8.10 /usr/bin/python3'" if name == "python3" else "exit 127"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    return {"PATH": f"{bindir}:/usr/bin:/bin", "PYENV_VERSION": "system"}


def test_host_python_38_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    with Sshd(tmp_path / "sshd", env=old_python_login(tmp_path / "bin")) as srv:
        for args in (["status", "gpubox"], ["runs", "gpubox"], ["launch", "gpubox"]):
            proc = cli("-F", str(srv.ssh_config), *args, cwd=tmp_path)
            assert proc.returncode == 2, (args, proc.stderr)
            line = one_line(proc.stderr)
            assert line.startswith("eagle3-tui: host python3 is 3.8.10 at /usr/bin/python3 on ")
            assert line.endswith("the agent needs ≥ 3.9 "
                                 '(set [host] python = "/path/to/python3.9+")'), line


def test_a_newer_python3_x_is_found_when_python3_is_old(tmp_path: Path) -> None:
    minor = f"python3.{sys.version_info[1]}"
    with Sshd(tmp_path / "sshd", env=old_python_login(tmp_path / "bin", minor)) as srv:
        link = SshLink(srv.alias, ssh_config=srv.ssh_config, cache_dir=str(tmp_path / "cache"))

        async def start() -> str:
            client = AgentClient(link, reconnect=False)
            try:
                return (await client.start()).python
            finally:
                await client.close()

        assert asyncio.run(start()) == ".".join(map(str, sys.version_info[:3]))
    assert link.found is not None and link.found.name == minor


def test_connect_shows_the_old_python_and_exits_2(tmp_path: Path) -> None:
    """The dashboard itself (in a real terminal) ends with the same line and exit 2."""
    with Sshd(tmp_path / "sshd", env=old_python_login(tmp_path / "bin")) as srv:
        code, out, _ = run_in_pty(["connect", "gpubox", "-F", str(srv.ssh_config)], tmp_path)
    assert code == 2, out
    assert "host python3 is 3.8.10 at /usr/bin/python3" in out


# ---- no terminal --------------------------------------------------------------------


def run_in_pty(args: list[str], cwd: Path, stdout_pipe: bool = False,
               timeout: float = 30) -> tuple[int, str, float]:
    """Run the CLI with a pseudo-terminal as stdin and stderr (and stdout unless piped)."""
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", *args], cwd=cwd, stdin=slave,
                            stdout=subprocess.PIPE if stdout_pipe else slave, stderr=slave,
                            env=checkout.env(TERM="xterm"))
    os.close(slave)
    out = b""
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        try:
            out += os.read(master, 65536)
        except (BlockingIOError, OSError):
            time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
    elapsed = time.monotonic() - t0
    try:
        out += os.read(master, 65536)
    except OSError:
        pass
    os.close(master)
    if stdout_pipe and proc.stdout:
        out += proc.stdout.read()
    return proc.wait(), out.decode("utf-8", "replace"), elapsed


@pytest.mark.parametrize("command", [["connect", "local"], ["demo"]])
def test_no_terminal_no_tui(command: list[str], tmp_path: Path) -> None:
    code, out, elapsed = run_in_pty(command, tmp_path, stdout_pipe=True)
    assert code == 2, out
    assert "needs a terminal (stdout is not one)" in out
    assert "status --json" in out and "demo --headless" in out
    assert "\x1b[" not in out  # no escape codes written anywhere
    assert elapsed < 3.0  # ~0.6 s here; the goal is under a second on an idle machine
    assert not (tmp_path / "eagle3-demo").exists()  # refused before building anything


# ---- the config ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "toml, args, line",
    [
        ('[host]\ntarget = ""\n', ["status"], "eagle3.toml: host.target: must not be empty"),
        ('[run]\nname = "x"\n', ["launch", "local"],
         "eagle3.toml: run.command: required (a list of strings)"),
        ('[run]\ncommand = "python x.py"\n', ["runs", "local"],
         "eagle3.toml: run.command: must be a list of strings (an argv, not a shell line), not str"),
    ],
)
def test_config_mistakes_exit_2(toml: str, args: list[str], line: str, tmp_path: Path) -> None:
    (tmp_path / "eagle3.toml").write_text(toml)
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc.stderr) == f"eagle3-tui: {tmp_path / line}"


def test_unknown_key_warns_and_the_command_still_works(tmp_path: Path) -> None:
    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\n[run]\nnmae = "typo"\n')
    proc = cli("runs", "local", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert one_line(proc.stderr) == (
        f"eagle3-tui: warning: {tmp_path / 'eagle3.toml'}: unknown key run.nmae ignored "
        "(did you mean run.name?)")


# ---- the demo's interpreter ---------------------------------------------------------


def site_of(python: str) -> Path:
    out = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


@pytest.mark.parametrize("kind", ["venv", "venv --system-site-packages", "uv venv"])
def test_demo_venv_sees_the_users_packages_and_its_own_speculators(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """eagle3-tui installed in a plain venv, a --system-site-packages venv or a uv venv (no
    pip in it): the demo's job interpreter imports what the user installed in *their*
    environment, and its own speculators 0.3.0 (the copy the patch screen patches)."""
    from tests import spec_wheel
    from tui.services.demo import ensure_speculators_venv, job_imports_missing

    wheel = spec_wheel.wheel_path()
    for var, value in (("PIP_NO_INDEX", "1"), ("PIP_FIND_LINKS", str(wheel.parent)),
                       ("UV_OFFLINE", "1"), ("UV_FIND_LINKS", str(wheel.parent))):
        monkeypatch.setenv(var, value)
    bindir = Path(sys.executable).parent  # uv comes with the test extra, beside this python
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    user_dir = tmp_path / "user"
    if kind == "uv venv":
        uv = shutil.which("uv")
        if uv is None:
            pytest.fail("uv not found: it comes with the test extra", pytrace=False)
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(user_dir)],
                       check=True, capture_output=True, timeout=120)
    else:
        subprocess.run([sys.executable, "-m", "venv", *kind.split()[1:], str(user_dir)],
                       check=True, capture_output=True, timeout=300)
    user = str(user_dir / "bin" / "python")
    (site_of(user) / "e3_user_marker.py").write_text("WHERE = 'user venv'\n")

    venv_python, note = ensure_speculators_venv(tmp_path / "demo-venv", user)
    assert note is None and venv_python is not None
    assert job_imports_missing(venv_python, ("e3_user_marker", "speculators")) is None
    assert job_imports_missing(venv_python, ("e3_user_marker", "no_such_pkg_e3")) == "no_such_pkg_e3"
    where = subprocess.run(
        [venv_python, "-c", "import importlib.util as u; "  # where, without importing its deps
         "print(u.find_spec('speculators').origin); print(u.find_spec('e3_user_marker').origin)"],
        check=True, capture_output=True, text=True).stdout.split()
    assert where[0].startswith(str(tmp_path / "demo-venv"))  # the demo's own copy
    assert where[1].startswith(str(user_dir))  # the user's environment, not the base's


# ---- the demo's outcome is its exit code -------------------------------------------


def test_demo_exits_non_zero_when_its_run_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import spec_wheel
    from tui.services.demo import build_demo

    wheel = spec_wheel.wheel_path()
    env = checkout.env(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheel.parent))
    for var in ("PIP_NO_INDEX", "PIP_FIND_LINKS"):
        monkeypatch.setenv(var, env[var])
    demo = tmp_path / "demo"
    paths = build_demo(demo)  # the same spec the CLI builds: it is reused below
    (paths.model / "config.json").write_text("{not json")  # the job dies reading it
    proc = cli("demo", "--headless", "--dir", str(demo), env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("eagle3-tui: demo run ") and " did not finish: exited with code " in last
    assert "launched demo run" in proc.stdout
    # built above: the CLI reuses it and says so; and it names the torch the job runs on
    assert f"reusing the demo's model, dataset and venv in {demo}/; the run starts fresh" in proc.stderr
    assert "the first time" not in proc.stderr
    assert "the demo's job runs on torch 2.13.0" in proc.stderr


def test_demo_again_says_it_reuses_the_build_and_whether_the_run_starts_fresh_or_resumes(
        tmp_path: Path) -> None:
    from tui.services.demo import MARKER, demo_intro

    demo = tmp_path / "demo"
    assert demo_intro(demo) == (f"preparing the demo in {demo}/ (the first time takes ~10 s)…", False)
    demo.mkdir()
    (demo / MARKER).write_text("{}")
    reuse = f"reusing the demo's model, dataset and venv in {demo}/; the run "
    assert demo_intro(demo) == (reuse + "starts fresh", False)
    (demo / "out").mkdir()
    for i in range(3):
        (demo / "out" / f"data_{i}.pt").write_bytes(b"")
    assert demo_intro(demo) == (reuse + f"resumes from the 3 samples already in {demo}/out/", False)
    (demo / "out" / "data_config.json").write_text("{}")
    assert demo_intro(demo) == (reuse + f"starts fresh (the finished run's outputs in {demo}/out/ are cleared)",
                                True)


@pytest.mark.parametrize("version, requires, said", [
    ("2.13.0+cpu", "", "torch 2.13.0+cpu (CPU build, 0 MB installed)"),
    ("2.13.0", 'Requires-Dist: nvidia-cuda-runtime==13.0.96; platform_system == "Linux"\n',
     "torch 2.13.0, a CUDA build"),
])
def test_the_demo_names_the_torch_its_job_runs_on(version: str, requires: str, said: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.services.demo import torch_of

    info = tmp_path / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n{requires}")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # found before any installed torch
    text = torch_of(sys.executable)
    if "CUDA" in said and os.path.isdir("/proc/driver/nvidia/gpus"):
        said = "torch 2.13.0 (CUDA build, "
    assert text.startswith(said), text


# ---- runs prune ----------------------------------------------------------------------


def test_runs_prune_removes_ended_runs_never_a_live_one(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    base = f'[host]\nruns_dir = "{runs}"\n[run]\ncwd = "{tmp_path}"\n'
    cfg = tmp_path / "eagle3.toml"

    def launch(name: str, argv: str, demo: bool = False) -> str:
        env = '\nenv = { EAGLE3_DEMO = "1" }' if demo else ""
        cfg.write_text(base + f'name = "{name}"\ncommand = {argv}{env}\n')
        proc = cli("launch", "local", "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return str(json.loads(proc.stdout)["run_id"])

    ended = [launch(f"quick{i}", '["true"]', demo=i == 0) for i in range(3)]
    live = launch("long", '["sleep", "60"]')
    deadline = time.monotonic() + 30
    while True:
        states = {r["run_id"]: r["state"] for r in
                  json.loads(cli("runs", "local", "--json", cwd=tmp_path).stdout)["runs"]}
        if all(states[r] == "exited" for r in ended):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.2)
    try:
        dry = json.loads(cli("runs", "prune", "local", "--keep", "0", "--dry-run", "--json",
                             cwd=tmp_path).stdout)
        assert sorted(r["run_id"] for r in dry["removed"]) == sorted(ended)
        assert all((runs / r).is_dir() for r in ended)  # a dry run removes nothing

        demo_only = json.loads(cli("runs", "prune", "local", "--demo", "--json", cwd=tmp_path).stdout)
        assert [r["run_id"] for r in demo_only["removed"]] == [ended[0]]

        proc = cli("runs", "prune", "local", "--keep", "1", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == "removed 1 run(s); 1 ended run(s) kept"
        assert not (runs / ended[1]).exists() and (runs / ended[2]).is_dir()  # newest kept
        assert (runs / live).is_dir()
        assert json.loads(cli("runs", "prune", "local", "--keep", "0", "--json",
                              cwd=tmp_path).stdout)["removed"][0]["run_id"] == ended[2]
        assert (runs / live).is_dir()  # a live run is never pruned
        assert cli("runs", "prune", "local", "--older-than", "1y", cwd=tmp_path).returncode == 2
    finally:
        cli("kill", "local", live, "--yes", cwd=tmp_path)


def test_an_old_configured_python_on_local_is_exit_2(tmp_path: Path) -> None:
    old = tmp_path / "python3.8"
    old.write_text("#!/bin/sh\necho '3.8.10 /opt/py38/bin/python3.8'\n")
    old.chmod(0o755)
    (tmp_path / "eagle3.toml").write_text(f'[host]\npython = "{old}"\n')
    proc = cli("status", "local", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc.stderr) == (
        f"eagle3-tui: host {old} is 3.8.10 at /opt/py38/bin/python3.8 on local; the agent "
        'needs ≥ 3.9 (set [host] python = "/path/to/python3.9+")')
