"""A newcomer's first minutes (issue 36): every "no config" message names the file it
read or looked for, `eagle3-tui init` writes a commented one (never over another),
`runs` points to the demo's runs from any directory, the demo's first line names the
torch it installed, and ./tests/run counts what it puts on the disk and leaves nothing
in the temp dir."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import checkout
from tests.deps_stamp import deps_hash
from tests.replay import ReplayClient, snapshot
from tests.test_app import until
from tests.test_hosttext import screen_strips
from tests.test_messages import toasts
from tui.services.config import load_config, parse_config
from tui.views.app import make_app

HINT = "eagle3-tui init writes a commented one"


def cli(*args: str, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = {"HOME": str(home), "XDG_STATE_HOME": str(home / ".local" / "state")} if home else {}
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, env=checkout.env(**extra),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)


# ---- eagle3-tui init -------------------------------------------------------------------


def test_init_writes_a_commented_config_and_never_overwrites_one(tmp_path: Path) -> None:
    proc = cli("init", cwd=tmp_path)
    path = tmp_path / "eagle3.toml"
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {path}: set [run] command in it")
    text = path.read_text()
    cfg = load_config(path)  # as written: the defaults, no warning
    assert cfg.warnings == () and cfg.run.command == () and text.startswith("# eagle3.toml")
    # every commented setting is a real key: uncommented, the file loads without a warning
    live = re.sub(r"(?m)^# (?=\[|[a-z_]+ = )", "", text)
    assert live != text
    cfg = parse_config(live, "eagle3.toml")
    assert cfg.warnings == () and cfg.run.command == ("python", "extract.py", "--tp", "8")
    path.write_text("# mine\n")
    again = cli("init", cwd=tmp_path)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr == f"eagle3-tui: {path} exists: not overwritten (edit it, or move it away first)\n"
    assert path.read_text() == "# mine\n"
    other = tmp_path / "sub" / "x.toml"
    other.parent.mkdir()
    assert cli("--config", str(other), "init", cwd=tmp_path).returncode == 0 and other.read_text() == text


# ---- messages that name the file --------------------------------------------------------


def test_launch_with_no_config_file_names_the_one_looked_for(tmp_path: Path) -> None:
    proc = cli("launch", "local", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"eagle3-tui: no config file: {tmp_path}/eagle3.toml not found, and launching "
                           f"needs its [run] command ({HINT})\n")


@pytest.mark.parametrize("with_file", [False, True])
async def test_l_and_r_without_a_command_name_the_config_file(with_file: bool, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "eagle3.toml"
    if with_file:
        path.write_text('[run]\nname = "kimi"\n')
    cfg = load_config(None)
    said = f"no [run] command in {path}" if with_file else f"no config file at {path} ({HINT})"
    app = make_app(ReplayClient([snapshot(1)]), cfg, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.press("l")
        await until(pilot, lambda: bool(toasts(app)))
        assert toasts(app) == [f"nothing to launch: {said}"]
        app.clear_notifications()
        await until(pilot, lambda: not toasts(app))
        await app.screen.run_action("relaunch")  # `r` is offered only with a run to relaunch
        await until(pilot, lambda: bool(toasts(app)))
        assert toasts(app) == [f"no run to relaunch and {said}"]


async def test_a_config_written_after_the_start_is_read_on_l(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ./eagle3.toml at the start; `eagle3-tui init` (or an editor) writes one while the
    dashboard is open: `l` reads it, and names it."""
    monkeypatch.chdir(tmp_path)
    app = make_app(ReplayClient([snapshot(1)]), load_config(None), "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        (tmp_path / "eagle3.toml").write_text('[run]\nname = "kimi"\n')
        await pilot.press("l")
        await until(pilot, lambda: bool(toasts(app)))
        assert toasts(app) == [f"nothing to launch: no [run] command in {tmp_path}/eagle3.toml"]


@pytest.mark.parametrize("with_file", [False, True])
async def test_the_empty_progress_panel_says_where_eagle3_toml_is(with_file: bool, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "w"  # short enough to show whole beside the GPU panel
    where.mkdir()
    monkeypatch.chdir(where)
    if with_file:
        (where / "eagle3.toml").write_text('[run]\nname = "kimi"\n')
    app = make_app(ReplayClient([snapshot(0, runs=[])]), load_config(None), "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.2)
        lines = [line.strip(" │") for line in screen_strips(app)]
        if with_file:
            expect = ["No run yet. l launches the [run] command of", f"{where}/eagle3.toml", "(or: eagle3-tui launch);"]
        else:
            expect = ["No run yet, and no config file at", f"{where}/eagle3.toml", f"({HINT});"]
        at = [i for i, line in enumerate(lines) if line.startswith(expect[0])]
        assert at, "\n".join(lines)
        shown = [line.split("│")[0].rstrip() for line in lines[at[0]:at[0] + len(expect)]]
        assert shown == expect, "\n".join(lines)


# ---- runs: the demo's runs from any directory ------------------------------------------


def test_runs_points_to_the_demos_runs_from_any_directory(tmp_path: Path) -> None:
    from tui.services import statefile

    home, elsewhere, demo = tmp_path / "home", tmp_path / "elsewhere", tmp_path / "checkout" / "eagle3-demo"
    for d in (home, elsewhere, demo):
        d.mkdir(parents=True)
    (demo / "eagle3.toml").write_text(f'[host]\nruns_dir = "{demo}/runs"\n')
    pointer = f"the demo's runs are in {demo}/runs: eagle3-tui --config {demo}/eagle3.toml runs"
    assert pointer not in cli("runs", cwd=elsewhere, home=home).stdout  # no demo noted yet
    env_state = home / ".local" / "state"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(env_state))
        statefile.remember_demo(demo)  # what `eagle3-tui demo` does after building it
    note = env_state / "eagle3-tui" / "demo-dir"
    assert oct(note.stat().st_mode & 0o777) == "0o600" and oct(note.parent.stat().st_mode & 0o777) == "0o700"
    empty = cli("runs", cwd=elsewhere, home=home)
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.splitlines()[-1] == pointer
    # once the default runs dir holds a run, the pointer stays, under the list
    (elsewhere / "eagle3.toml").write_text('[run]\nname = "mine"\ncommand = ["true"]\n')
    launched = cli("launch", "local", "--json", cwd=elsewhere, home=home)
    assert launched.returncode == 0, launched.stderr
    (elsewhere / "eagle3.toml").unlink()
    listed = cli("runs", cwd=elsewhere, home=home)
    assert json.loads(launched.stdout)["run_id"] in listed.stdout and listed.stdout.splitlines()[-1] == pointer
    # reading the demo's own runs: no pointer; a deleted demo: no pointer
    own = cli("--config", str(demo / "eagle3.toml"), "runs", cwd=elsewhere, home=home)
    assert own.returncode == 0 and pointer not in own.stdout, own.stdout
    (demo / "eagle3.toml").unlink()
    assert "the demo's runs" not in cli("runs", cwd=elsewhere, home=home).stdout


# ---- the demo's first line: which torch, what build, how big ---------------------------


def test_torch_of_names_version_build_and_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.services.demo import torch_of

    here = torch_of(sys.executable)  # the real one
    # CPU build; a CUDA build on a GPU machine; a CUDA build here (PyPI's, where the CPU index is out of reach)
    assert re.fullmatch(r"torch 2\.13\.0\S*(?: \(CPU build, | \(CUDA [0-9.]+ build, .*, |, a CUDA [0-9.]+ build .*\()"
                        r"[0-9.]+ (MB|GB)( installed)?.*", here), here
    info = tmp_path / "torch-2.13.0.dist-info"
    info.mkdir()
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text("from typing import Optional\ncuda: Optional[str] = '12.8'\n")
    (tmp_path / "torch" / "lib.so").write_bytes(b"\0" * 3_000_000)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
    (info / "RECORD").write_text("torch/version.py,,\ntorch/lib.so,,\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # found before any installed torch
    said = torch_of(sys.executable)
    assert "a CUDA 12.8 build" in said or "(CUDA 12.8 build, " in said, said
    # its own 3 MB, with the nvidia-*/cuda-* packages of an environment that holds PyPI's CUDA torch
    assert re.search(r"\b[0-9.]+ (MB|GB) installed", said) and ("3 MB installed" in said or "nvidia-*" in said), said
    (tmp_path / "torch" / "version.py").write_text("cuda: Optional[str] = None\n")
    os.rename(info, tmp_path / "torch-2.13.0+cpu.dist-info")
    (tmp_path / "torch-2.13.0+cpu.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
    assert torch_of(sys.executable) == "torch 2.13.0+cpu (CPU build, 3 MB installed)"


def test_the_demos_first_line_names_the_torch(tmp_path: Path) -> None:
    """Before anything is built (here the build fails at once: DIR is a file)."""
    (tmp_path / "file").write_text("")
    proc = cli("demo", "--headless", "--dir", str(tmp_path / "file"), cwd=tmp_path, home=tmp_path)
    assert proc.returncode == 2, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert re.fullmatch(r"the demo's job runs on torch 2\.13\.0\S*[ ,].*build.*[0-9.]+ (MB|GB) installed.*",
                        first), first
    last = proc.stderr.splitlines()[-1]  # one line, no traceback ("File exists", "Not a directory")
    assert last.startswith(f"eagle3-tui: cannot build the demo in {tmp_path}/file: ") and "Traceback" not in proc.stderr


# ---- ./tests/run: what it puts on the disk -----------------------------------------------


def test_tests_run_counts_its_disk_and_leaves_no_temp_dir(tmp_path: Path) -> None:
    """tests/run on two tiny test files, with its own cache and two workers (as on a
    2-core machine): each file goes to a worker, every tmp_path lies in a per-run dir
    under the cache, removed at the end; the total is printed."""
    stamp = Path(sys.prefix, ".eagle3-test-deps")
    want = f"{deps_hash(checkout.ROOT / 'pyproject.toml')} torch==2.13.0"
    if not stamp.is_file() or stamp.read_text().strip() != want:  # it would reinstall this venv
        pytest.skip(f"{sys.prefix} was not made by ./tests/run from this pyproject.toml")
    cache, said_at = tmp_path / "cache", tmp_path / "where"
    probes = [tmp_path / f"test_probe{i}.py" for i in range(2)]
    for probe in probes:  # a file each, slow enough that one worker cannot take both
        probe.write_text("import os, sys, tempfile, time\n\ndef test_where(tmp_path):\n"
                         "    time.sleep(2)\n"
                         "    with open(os.environ['PROBE_OUT'], 'a') as f:\n"
                         "        print(tmp_path, tempfile.gettempdir(), os.environ['PYTEST_XDIST_WORKER'], file=f)\n")
    env = checkout.env(EAGLE3_TEST_VENV=sys.prefix, EAGLE3_TUI_TEST_CACHE=str(cache), EAGLE3_TESTS_WORKERS="2",
                       PROBE_OUT=str(said_at))
    proc = subprocess.run([str(checkout.ROOT / "tests" / "run"), *map(str, probes)],
                          cwd=checkout.ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    where = [line.split() for line in said_at.read_text().splitlines()]
    assert sorted(w[2] for w in where) == ["gw0", "gw1"], where
    run_dir = next(p for p in Path(where[0][0]).parents if p.name.startswith("run."))
    assert all(Path(w[0]).is_relative_to(run_dir) for w in where), where
    assert run_dir.parent == cache
    assert not run_dir.exists()  # removed at the end
    assert list(cache.iterdir()) == [cache / "pytest-cache"]  # pytest's cache: counted there
    said = proc.stderr[proc.stderr.index("tests/run: disk used by the tests"):].splitlines()
    total = int(re.search(r"([0-9]+) MB in all", said[0]).group(1))  # type: ignore[union-attr]
    parts = [int(line.split()[0]) for line in said[1:5]]
    assert [line.split("MB")[1].split()[0] for line in said[1:5]] == ["venv", "cache", "temp", "bytecode"]
    assert abs(total - sum(parts)) <= 2 and parts[0] > 100, said
