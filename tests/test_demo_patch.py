"""The demo's patch feature for real: its venv holds the real speculators 0.3.0, and the
real `eagle3-tui patch` CLI pushes and rolls back the bundled set against the demo config.

pip installs from the cached wheel of tests/spec_wheel.py (PIP_NO_INDEX + PIP_FIND_LINKS),
so the test runs offline once the wheel is cached; without network and without the cached
wheel it skips with the reason -- except under CI, where that is a failure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import checkout, spec_wheel
from tests.patch_fixtures import GEN, SET, WORKER
from tests.test_demo_build import need_ml
from tui.services.config import parse_config
from tui.services.demo import PATCH_SET, VENV_MARKER, DemoPaths, build_demo
from tui.state import patches as P

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"shards": 4, "layers": 7, "hidden": 32, "sequences": 4, "seq_len": 8, "shard_delay": 0.01}
FIND_SPEC = ("import importlib.util; "
             "print(importlib.util.find_spec('speculators').submodule_search_locations[0])")


@pytest.fixture(scope="module")
def wheel_only() -> Iterator[Path]:
    """pip (in build_demo's subprocesses) installs only from the cached real wheel."""
    wheel = spec_wheel.wheel_path()  # skips, or fails under CI, when it cannot be had
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_NO_INDEX", "1")
        mp.setenv("PIP_FIND_LINKS", str(wheel.parent))
        yield wheel


@pytest.fixture(scope="module")
def demo(wheel_only: Path, tmp_path_factory: pytest.TempPathFactory) -> DemoPaths:
    need_ml()
    return build_demo(tmp_path_factory.mktemp("demo"), **SMALL)


def venv_python(paths: DemoPaths) -> str:
    return str(paths.root / "venv" / "bin" / "python")


def patch_cli(paths: DemoPaths, *args: str) -> subprocess.CompletedProcess[str]:
    """`eagle3-tui --config DEMO/eagle3.toml patch ARGS`, as a real process."""
    env = checkout.env(XDG_CONFIG_HOME=str(paths.root / "xdg"))  # no user patch sets
    return subprocess.run([sys.executable, "-m", "tui.cli", "--config", str(paths.config),
                           "patch", *args], cwd=ROOT, env=env, check=False, capture_output=True,
                          text=True, timeout=60)


def first_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[0]


def test_demo_config_names_the_venv_and_the_patch_set(demo: DemoPaths) -> None:
    assert demo.patches_note is None and demo.patch_set == PATCH_SET == SET
    assert demo.python == venv_python(demo)
    cfg = parse_config(demo.config.read_text(), str(demo.config))
    assert cfg.host.python == cfg.run.command[0] == demo.command[0] == venv_python(demo)
    assert cfg.patches.set == SET
    # The venv python finds the venv's speculators (not some other copy) without importing it.
    proc = subprocess.run([venv_python(demo), "-c", FIND_SPEC], check=False,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    pkg = Path(proc.stdout.strip())
    assert pkg.is_relative_to(demo.root / "venv") and pkg.name == "speculators"
    for rel in (GEN, WORKER):
        assert (pkg / rel).read_bytes() == spec_wheel.package_bytes(rel)


def test_patch_cli_pushes_and_rolls_back_the_demo(demo: DemoPaths) -> None:
    pkg = next((demo.root / "venv").glob("lib/python*/site-packages/speculators"))
    pset = P.load_set_dir(P.bundled_sets_dir() / SET)
    latest = pset.versions[-1]
    assert first_line(patch_cli(demo, "status", "local")) == "pristine"

    assert first_line(patch_cli(demo, "push", "latest", "--yes")) == f"{latest.name} (was pristine)"
    assert latest.name == "v5"
    for rel in (GEN, WORKER):
        data = (pkg / rel).read_bytes()
        assert P.sha256(data) == latest.sha256.get(rel, pset.files[rel])
        assert data != spec_wheel.package_bytes(rel)  # v5 rewrites both files
        assert (pkg / (rel + ".eagle3-pristine")).read_bytes() == spec_wheel.package_bytes(rel)
    assert first_line(patch_cli(demo, "status", "local")) == latest.name

    assert first_line(patch_cli(demo, "rollback", "--yes")) == f"pristine (was {latest.name})"
    for rel in (GEN, WORKER):
        assert (pkg / rel).read_bytes() == spec_wheel.package_bytes(rel)


def test_demo_extract_runs_with_the_venv_python(demo: DemoPaths) -> None:
    argv = parse_config(demo.config.read_text()).run.command
    assert argv[0] == venv_python(demo)
    proc = subprocess.run(list(argv), cwd=demo.root, check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.match(r"^\[extract\] done: 4 sequences, 32 tokens in ", proc.stdout.splitlines()[-1])
    assert (demo.out / "data_config.json").is_file()


def test_rebuild_reuses_the_venv(demo: DemoPaths) -> None:
    marker = demo.root / "venv" / VENV_MARKER
    installed = next((demo.root / "venv").glob(f"lib/python*/site-packages/speculators/{GEN}"))
    before = (marker.stat().st_mtime_ns, installed.stat().st_mtime_ns)
    assert json.loads(marker.read_text())["spec"] == "speculators==0.3.0"
    again = build_demo(demo.root, **SMALL)
    assert (again.python, again.patch_set, again.patches_note) == (
        demo.python, demo.patch_set, None)
    assert (marker.stat().st_mtime_ns, installed.stat().st_mtime_ns) == before


def test_failed_install_falls_back_then_a_later_build_recovers(
        wheel_only: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline (no index, no wheel) the demo still builds, without patches, and says why;
    the next build with the wheel reachable gets the patch demo."""
    need_ml()
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    off = build_demo(tmp_path / "d", **SMALL)
    assert off.patches_note is not None and off.patches_note.startswith(
        "cannot install speculators==0.3.0 (")
    assert "\n" not in off.patches_note
    assert off.patch_set is None and off.python == off.command[0] == sys.executable
    cfg = parse_config(off.config.read_text())
    assert cfg.patches.set is None and cfg.host.python == sys.executable

    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel_only.parent))
    on = build_demo(tmp_path / "d", **SMALL)
    assert on.patches_note is None and on.patch_set == SET
    assert parse_config(on.config.read_text()).host.python == venv_python(on)
