"""`eagle3-tui patch …` against the REAL local agent and a temp site-packages holding the
real speculators 0.3.0 files. Most tests use click's CliRunner (same process, fast);
the hand-edit test runs the command as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from tests import checkout, spec_wheel
from tests.patch_fixtures import GEN, HAND_EDIT, SET, WORKER, hand_edit, pkg, site  # noqa: F401
from tui.cli import Ctx, main
from tui.cli.patch import patch
from tui.services import patches as S
from tui.state import patches as P
from tui.state.patchtext import plan_lines, shorten_left

REPO = Path(__file__).resolve().parents[1]
# Until tui/cli/ registers the group itself; then this is a no-op.
if "patch" not in main.commands:
    main.add_command(patch)
# The `eagle3-tui` entry point, as a real process (the group registered the same way).
ENTRY = ("import sys; from tui.cli import main; from tui.cli.patch import patch\n"
         "if 'patch' not in main.commands: main.add_command(patch)\n"
         "sys.argv[0] = 'eagle3-tui'; main()")


@pytest.fixture
def pset() -> P.PatchSet:
    return P.load_set_dir(P.bundled_sets_dir() / SET)


@pytest.fixture
def pristine() -> dict[str, bytes]:
    return spec_wheel.pristine_files()


@pytest.fixture
def config(tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    """eagle3.toml with the host python = this python and the bundled set; the user's
    patch dir (XDG_CONFIG_HOME) is a temp dir so `capture` never touches ~/.config."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)  # no stray ./eagle3.toml
    cfg = tmp_path / "eagle3.toml"
    cfg.write_text(f'[host]\npython = {json.dumps(sys.executable)}\n'
                   f'runs_dir = {json.dumps(str(tmp_path / "runs"))}\n'
                   f'[patches]\nset = "{SET}"\n')
    return cfg


def cli(config: Path, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, ["--config", str(config), "patch", *args], input=input)


def first_line(result: Result) -> str:
    return result.stdout.splitlines()[0]


def test_status_push_latest_and_rollback(config: Path, site: Path, pset: P.PatchSet,  # noqa: F811
                                         pristine: dict[str, bytes]) -> None:
    r = cli(config, "status")
    assert r.exit_code == 0 and first_line(r) == "pristine", r.output
    assert GEN in r.stdout and WORKER in r.stdout
    newest = P.latest(pset)
    r = cli(config, "push", "latest", "--yes")
    assert r.exit_code == 0, r.output
    want = P.build_version(pset, newest.name, pristine)
    for rel, data in want.items():  # the verified hash of every file is printed
        assert P.sha256(data) in r.stdout and str(pkg(site, rel)) in r.stdout
        assert pkg(site, rel).read_bytes() == data
        compile(data, str(pkg(site, rel)), "exec")  # the pushed file is valid Python
    assert first_line(cli(config, "status")) == newest.name
    st = json.loads(cli(config, "status", "--json").stdout)
    assert st["state"] == st["version"] == newest.name and st["files"][GEN]["backup"]
    r = cli(config, "rollback", "--yes")
    assert r.exit_code == 0 and first_line(r).startswith(f"pristine (was {newest.name})"), r.output
    assert {rel: pkg(site, rel).read_bytes() for rel in pristine} == pristine  # byte-identical


def test_push_asks_first_and_no_changes_nothing(config: Path, site: Path,  # noqa: F811
                                                pset: P.PatchSet, pristine: dict[str, bytes]) -> None:
    v3 = P.get_version(pset, "v3")
    r = cli(config, "push", "v3", input="n\n")
    assert r.exit_code == 1 and "cancelled" in r.stderr
    # The question names the host, the current -> target state, the title and the files.
    assert "local" in r.stderr and "pristine → v3" in r.stderr and v3.title in r.stderr
    assert str(pkg(site, GEN)) in r.stderr and str(pkg(site, WORKER)) in r.stderr
    assert {rel: pkg(site, rel).read_bytes() for rel in pristine} == pristine
    r = cli(config, "push", "v3", input="y\n")
    assert r.exit_code == 0 and first_line(r) == "v3 (was pristine)", r.output
    r = cli(config, "rollback", "v1", input="y\n")  # one argument that is a version: TO
    assert r.exit_code == 0 and first_line(r) == "v1 (was v3)", r.output
    assert str(pkg(site, WORKER)) in r.stderr  # v3 touched the worker; v1 does not


def test_hand_edit_is_refused_then_forced_real_process(config: Path, site: Path,  # noqa: F811
                                                       pset: P.PatchSet, pristine: dict[str, bytes],
                                                       tmp_path: Path) -> None:
    env = checkout.env()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        # --config after `patch`, as users type it (`eagle3-tui patch --config F status`)
        return subprocess.run([sys.executable, "-c", ENTRY, "patch", "--config", str(config), *args],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
                              check=False)

    assert run("push", "v2", "--yes").returncode == 0  # leaves the pristine backup on the host
    edited = hand_edit(site)
    r = run("status")
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "unknown (edited by hand)"
    r = run("push", "v1", "--yes")
    assert r.returncode == 1 and r.stdout == ""
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("eagle3-tui:")]
    assert len(errors) == 1 and "edited by hand" in errors[0] and "--force" in errors[0]
    assert "Traceback" not in r.stderr
    # the diff against pristine goes to stderr too
    assert "+" + HAND_EDIT[1].decode() in r.stderr and "-" + HAND_EDIT[0].decode() in r.stderr
    assert pkg(site, GEN).read_bytes() == edited  # untouched
    r = run("push", "v1", "--yes", "--force")
    assert r.returncode == 0 and "forced" in r.stdout.splitlines()[0], r.stderr
    assert pkg(site, GEN).read_bytes() == P.build_version(pset, "v1", pristine)[GEN]
    assert run("status").stdout.splitlines()[0] == "v1"


def test_capture_a_hand_edit(config: Path, site: Path, tmp_path: Path) -> None:  # noqa: F811
    assert cli(config, "push", "latest", "--yes").exit_code == 0
    edited = hand_edit(site)
    r = cli(config, "capture", "v6", "--title", "eight sequences", "--fixes", "oom")
    assert r.exit_code == 0, r.output
    mine = tmp_path / "xdg" / "eagle3-tui" / "patches" / SET
    assert (mine / "v6.diff").is_file() and "+" + HAND_EDIT[1].decode() in (mine / "v6.diff").read_text()
    assert first_line(cli(config, "status")) == "v6"
    assert cli(config, "push", "v2", "--yes").exit_code == 0
    assert cli(config, "push", "v6", "--yes").exit_code == 0
    assert pkg(site, GEN).read_bytes() == edited
    r = cli(config, "capture", "v7", "--title", "again")
    assert r.exit_code == 1 and "nothing to capture" in r.stderr


def test_usage_errors_are_one_line(config: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.toml"
    bare.write_text("[host]\n")
    cases = [
        (["--config", str(bare), "patch", "status"], 2, "no patch set"),
        (["--config", str(config), "patch", "push", "v9", "--yes"], 2, "no version 'v9'"),
        (["--config", str(config), "patch", "rollback", "v9", "--yes"], 2, "no version 'v9'"),
        (["--config", str(config), "patch", "status", "--set", "nope"], 2, "no patch set named 'nope'"),
        (["--config", str(tmp_path / "absent.toml"), "patch", "status", "--set", SET], 2, "not found"),
        (["--config", str(config), "patch", "capture", "v6", "--title", "x"], 1, "nothing to capture"),
    ]
    for argv, code, text in cases:
        r = CliRunner().invoke(main, argv)
        assert r.exit_code == code, (argv, r.output)
        assert len(r.stderr.splitlines()) == 1 and text in r.stderr, (argv, r.stderr)


def test_unreachable_host_is_exit_3(config: Path) -> None:
    r = cli(config, "status", "nohost.invalid")
    assert r.exit_code == 3 and len(r.stderr.splitlines()) == 1 and "nohost.invalid" in r.stderr


def test_missing_backup_hand_edit_cannot_be_forced(config: Path, site: Path) -> None:  # noqa: F811
    hand_edit(site)  # on a pristine install: no backup exists, so no pristine copy
    r = cli(config, "push", "latest", "--yes", "--force")
    assert r.exit_code == 1 and "no pristine copy" in r.stderr
    assert not Path(str(pkg(site, GEN)) + S.BACKUP_SUFFIX).exists()


def test_rollback_over_hand_edits_is_refused_with_the_diff(config: Path, site: Path) -> None:  # noqa: F811
    assert cli(config, "push", "v2", "--yes").exit_code == 0  # leaves the pristine backup
    edited = hand_edit(site)
    r = cli(config, "rollback", "--yes")
    assert r.exit_code == 1 and r.stdout == ""
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("eagle3-tui:")]
    assert len(errors) == 1 and "edited by hand" in errors[0]
    assert "+" + HAND_EDIT[1].decode() in r.stderr  # the diff against pristine, before the error
    assert pkg(site, GEN).read_bytes() == edited


def test_global_options_are_accepted_after_patch(config: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.toml"
    bare.write_text("[host]\n")  # no patch set: would be exit 2 if it were the one used
    r = CliRunner().invoke(main, ["--config", str(bare), "patch", "--config", str(config), "status"])
    assert r.exit_code == 0 and first_line(r) == "pristine", r.output  # the later one wins
    # -F and --accept-new-host-key land on the same Ctx the subcommands use
    ssh_cfg = str(tmp_path / "ssh_config")
    obj = Ctx(str(bare), None, False)
    r = CliRunner().invoke(patch, ["--config", str(config), "-F", ssh_cfg, "--accept-new-host-key",
                                   "status", "--json"], obj=obj)
    assert r.exit_code == 0 and json.loads(r.stdout)["state"] == "pristine", r.output
    assert (obj.config_path, obj.ssh_config, obj.accept_new) == (str(config), ssh_cfg, True)
    r = CliRunner().invoke(main, ["patch", "--bogus", "status"])
    assert r.exit_code == 2 and "No such option" in r.stderr  # unknown ones are still refused


@given(st.text(alphabet="abc/._-", min_size=1, max_size=120), st.integers(min_value=2, max_value=100))
def test_shorten_left_fits_and_keeps_the_end(path: str, width: int) -> None:
    short = shorten_left(path, width)
    assert len(short) <= width
    assert short == path or (short.startswith("…") and path.endswith(short[1:]) and len(path) > width)


def test_plan_lines_fit_a_width_one_path_a_line() -> None:
    long_dir = "/home/someone/.venvs/extraction-env/lib/python3.11/site-packages/speculators/"
    st_ = {"set": "s", "target": "speculators 0.3.0", "distribution_version": "0.3.0", "state": "v2",
           "files": {f"data_generation/{n}.py": {"abs_path": f"{long_dir}data_generation/{n}.py",
                                                 "state": "v2"} for n in ("a_long_module_name", "b")}}
    title = "a title long enough that it has to wrap under its value column in a dialog box"
    lines = plan_lines(st_, "v3", title, "gpu-box", width=60)
    assert max(map(len, lines)) <= 60
    at = [ln.startswith("files:") for ln in lines].index(True)
    assert lines[at] == "files:   2 to rewrite"
    paths = [f["abs_path"] for f in st_["files"].values()]
    shown = lines[at + 1:]
    assert len(shown) == 2  # one line each, shortened from the left, same indent
    for line, full in zip(shown, paths):
        assert line.startswith("  …/") and full.endswith(line[3:])
    for line in lines[:at]:  # a wrapped value continues under its value column
        assert line[:9].rstrip().endswith(":") or (line.startswith(" " * 9) and line[9] != " ")
    assert " ".join(" ".join(lines).split()).count(title) == 1  # wrapped, not cut
    whole = plan_lines(st_, "v3", title, "gpu-box")  # the CLI: paths whole, for copying
    assert [ln.strip() for ln in whole[-2:]] == [f["abs_path"] for f in st_["files"].values()]
