"""One declaration per op and per key (docs/architecture.md, "Adding a key and an op").

The host's ops are declared once, by `@op` on their handlers (remote/base/wire.py `OPS`); the
client's reply types name their op (tui/protocol/ops.py `REPLIES`); the dashboard's keys
are declared once, as `Binding`s with an id and a tooltip (`ACTION_KEYS`), from which the
footer, `?`, the command palette and the CLI twin are derived. These tests hold the
declarations to each other and check that the old hand-kept lists are gone."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import click
import pytest

import remote.agent.main  # noqa: F401 - imports every module that declares an op
from remote.base.wire import OPS
from tests.replay import ReplayClient, snapshot
from tui.cli.main import main as cli
from tui.protocol.ops import REPLIES, ActionReply
from tui.services.config import parse_config
from tui.transport import AgentApi
from tui.views.app import make_app
from tui.views.screens.dashboard import DashboardScreen
from tui.views.screens.dashboard_actions import ACTION_KEYS
from tui.views.screens.help import HelpScreen, cli_twin

ROOT = Path(__file__).resolve().parents[1]
CAPABILITIES = {"snapshot", "logs", "files", "runs", "kill"}  # the hello's words (protocol doc)


def undeclared_handlers(root: Path) -> list[str]:
    """Every function named `op_*` under root/remote that no `@op(...)` declares: a handler
    the agent would never dispatch to."""
    found = []
    for path in sorted((root / "remote").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("op_"):
                declared = any(isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "op"
                               for d in node.decorator_list)
                if not declared:
                    found.append(f"{path.relative_to(root)}: {node.name}")
    return found


def constrained_typevars(root: Path) -> list[str]:
    """Every `TypeVar("T", A, B, …)` under root/tui: a list of types to keep in step."""
    found = []
    for path in sorted((root / "tui").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "TypeVar"
                    and len(node.args) > 1):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


# -- the host ------------------------------------------------------------------------------


def test_every_op_has_a_handler_and_a_capability() -> None:
    assert len(OPS) >= 16
    for name, spec in OPS.items():
        assert callable(spec.handler) and spec.handler.__name__ == f"op_{name}", name
        assert spec.capability in CAPABILITIES, (name, spec.capability)
        assert spec.long or not spec.finish, f"{name}: only a worker thread can be waited for"
    assert {n for n, s in OPS.items() if s.action} == {"launch", "kill"}


def test_every_op_handler_is_declared() -> None:
    assert undeclared_handlers(ROOT) == []


def test_the_handler_check_finds_an_undeclared_one(tmp_path: Path) -> None:
    fileops = (ROOT / "remote" / "agent" / "fileops.py").read_text(encoding="utf-8")
    (tmp_path / "remote" / "agent").mkdir(parents=True)
    (tmp_path / "remote" / "agent" / "fileops.py").write_text(
        fileops + "\n\ndef op_forgotten(agent, args, rid):\n    return {}\n", encoding="utf-8")
    assert undeclared_handlers(tmp_path) == ["remote/agent/fileops.py: op_forgotten"]


def test_the_hello_says_the_capabilities_of_the_ops_it_can_run() -> None:
    from remote.base.wire import capabilities

    assert set(capabilities(True)) == CAPABILITIES
    # without the run modules, no op that needs them is offered, nor any word they share
    assert set(capabilities(False)) == {"snapshot", "logs", "files"}


def test_the_old_hand_kept_lists_are_gone() -> None:
    import remote.agent.outcomes
    import tui.protocol.ops
    from remote.agent.main import Agent

    assert not hasattr(Agent, "LONG_OPS") and not hasattr(Agent, "FINISH_ON_EOF")
    assert not hasattr(remote.agent.outcomes, "ACTION_OPS")
    assert not hasattr(tui.protocol.ops, "__all__")
    assert constrained_typevars(ROOT) == []  # settle's type is bound to ActionReply, not a list
    assert DashboardScreen.DASHBOARD_ACTIONS == tuple(b.action for b in ACTION_KEYS)


# -- the client's types, held to the host's ops ---------------------------------------------


def test_agent_api_and_reply_types_match_the_hosts_ops() -> None:
    methods = {name for name in vars(AgentApi) if not name.startswith("_")} - {"request", "call_with_progress"}
    assert methods == set(OPS), (set(OPS) - methods, methods - set(OPS))
    assert set(REPLIES) <= set(OPS), set(REPLIES) - set(OPS)
    for name, reply in REPLIES.items():
        assert reply.op == name and callable(getattr(reply, "parse", None)), name
    actions = {n for n, r in REPLIES.items() if issubclass(r, ActionReply)}
    assert actions == {n for n, s in OPS.items() if s.action}


# -- the dashboard's keys: footer, help, palette and CLI twin from one declaration ----------


def cli_command(words: list[str]) -> click.Command | None:
    cmd: Any = cli
    for word in words:
        if not isinstance(cmd, click.Group) or word not in cmd.commands:
            return None
        cmd = cmd.commands[word]
    return cmd if not isinstance(cmd, click.Group) else None


@pytest.mark.parametrize("key", ACTION_KEYS, ids=lambda b: b.action)
def test_every_key_is_declared_whole(key: Any) -> None:
    assert key.id and key.description and key.tooltip, key
    assert callable(getattr(DashboardScreen, f"action_{key.action}", None)), key.action
    assert key in DashboardScreen.BINDINGS
    twin = cli_twin(key).split()
    assert twin[0] == "eagle3-tui" and cli_command(twin[1:]) is not None, f"{key.id}: no command {twin}"


def test_a_key_id_that_names_no_command_has_no_twin() -> None:
    assert cli_command(["runs", "nonesuch"]) is None and cli_command(["patch"]) is None


async def test_every_key_has_a_help_line_and_a_palette_entry() -> None:
    cfg = parse_config('[run]\nname = "kimi"\ncommand = ["python", "x.py"]\nlog = "/srv/x.log"\n'
                       '[patches]\nset = "eagle3"\n')
    app = make_app(ReplayClient([snapshot(1)]), cfg, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)):
        screen = app.dashboard
        keys, _ = HelpScreen.for_screen(screen, app).contents
        palette = {c.title: c for c in app.get_system_commands(screen)}
        for key in ACTION_KEYS:
            assert (key.key, key.description, cli_twin(key)) in keys, key
            assert palette[key.description].help == key.tooltip
            assert palette[key.description].callback == getattr(screen, f"action_{key.action}")


# -- the key and op added through "Adding a key and an op": D, disk_usage, `runs df` ---------


async def test_disk_usage_reads_the_nearest_existing_folder(client: Any, tmp_path: Path) -> None:
    import shutil

    disk = await client.disk_usage(str(tmp_path / "not-yet" / "made"))
    assert disk.path == str(tmp_path)
    assert 0 < disk.free <= disk.total
    assert abs(disk.free - shutil.disk_usage(tmp_path).free) < 2**30
    runs_dir = await client.disk_usage(None)  # the agent's runs dir (tmp_path/runs, not made yet)
    assert runs_dir.path == str(tmp_path)


def test_disk_usage_says_low_under_10_gib_or_5_percent() -> None:
    from tui.protocol.ops import DiskUsage

    gib = 2**30
    assert not DiskUsage("/w", 100 * gib, 50 * gib).low
    assert DiskUsage("/w", 100 * gib, 9 * gib).low  # under 10 GiB
    assert DiskUsage("/w", 1000 * gib, 40 * gib).low  # under 5 %
    assert DiskUsage("/w", 1000 * gib, 60 * gib).summary() == "/w: 60.0 GiB free of 1,000.0 GiB (94% used)"
    assert DiskUsage.parse({"path": "/a\x1b[2Jb", "total": 4, "free": 1}).path == "/ab"  # host text


def test_runs_df_is_the_keys_twin(tmp_path: Path) -> None:
    from click.testing import CliRunner

    config = tmp_path / "eagle3.toml"
    config.write_text(f'[host]\nruns_dir = "{tmp_path / "runs"}"\n')
    r = CliRunner().invoke(cli, ["--config", str(config), "runs", "df", "local", "--path", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"{tmp_path}: ") and "GiB free of" in r.output


async def test_d_shows_the_free_space_of_the_runs_dir(client: Any, tmp_path: Path) -> None:
    cfg = parse_config('[run]\nname = "kimi"\n')
    app = make_app(client, cfg, "local")
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        await pilot.press("D")
        for _ in range(100):
            shown = [str(n.message) for n in app._notifications]
            if any("GiB free of" in m for m in shown):
                break
            await pilot.pause(0.05)
        assert any(m.startswith(f"{tmp_path}: ") for m in shown), shown
