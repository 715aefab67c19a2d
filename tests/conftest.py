"""Shared fixtures: a real OpenSSH sshd (session-scoped) and a started local agent client;
and after every test that had a tmp_path, no run of it left alive."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from remote.base.trust import private_group
from tests.slurm import LINES as SLURM_LINES
from tests.slurm import Cluster
from tests.slurm import missing as slurm_missing
from tests.sshd import Sshd, sshd_missing
from tui.transport import AgentClient, LocalLink

LEAK_GRACE_S = 5.0  # how long a run's shim may take to end after the test's own kill
AGENT_MAIN = os.path.join("agent", "main.py")  # a host agent's argv: [python, -u, …/agent/main.py, --runs-dir, DIR]

# Every test runs under umask 002, Ubuntu's default for its users (user-private groups):
# what eagle3-tui creates must carry its own mode whatever the umask (a demo once made its
# runs dir 0775 and then refused it), and the suite is where that is seen. Where the
# user's primary group is shared, 002 would make what the tests plant group-writable for
# real, so there it is 022. A few tests set 022 and 077 themselves
# (test_host_trust_open: everything the agent creates has its own mode).
os.umask(0o002 if private_group(os.getegid()) else 0o022)


# Tests that need root carry `needs_root(covers, userns=...)`. As a normal user they are
# listed before the run (what they cover, the one command that runs them) and skipped;
# those with userns=True need root only to mount (a tmpfs), and tests/run runs them
# after the main run as root of a user namespace where the kernel allows one
# (EAGLE3_TESTS_USERNS: "later" in the main run, "inside" in the namespace).
ROOT_COMMAND = "sudo ./tests/run -m needs_root"
_LATER: Counter[str] = Counter()  # what runs in the user namespace after the main run


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_root(covers, userns=False): needs root (listed before a normal "
                            "user's run; userns=True: runs as root of a user namespace there)")


def _root_only(item: pytest.Item) -> pytest.Mark | None:
    return item.get_closest_marker("needs_root")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests import timeouts

    timeouts.apply(items)  # a test's timeout: pyproject's 120 s, or its `slow(timeout=..., reason=...)`
    # The files with a test marked slow first (in their order), then the rest: ./tests/run
    # hands whole files to its workers (xdist, --dist loadfile) in this order, and a
    # minute-long file handed out last kept one worker busy while the others had none.
    slow_files = {i.path for i in items if i.get_closest_marker("slow") is not None}
    items.sort(key=lambda i: i.path not in slow_files)
    userns = os.environ.get("EAGLE3_TESTS_USERNS", "")
    if userns == "inside":  # only what a user namespace's root can do
        keep = [i for i in items if (m := _root_only(i)) is not None and m.kwargs.get("userns")]
    elif os.geteuid() != 0 and userns == "later":  # those run in the namespace afterwards
        keep = [i for i in items if not ((m := _root_only(i)) is not None and m.kwargs.get("userns"))]
        _LATER.update(m.args[0] for i in items if i not in keep and (m := _root_only(i)) is not None)
        if _LATER and os.environ.get("EAGLE3_TESTS_USERNS_FILE"):  # tests/run: a namespace run is due
            Path(os.environ["EAGLE3_TESTS_USERNS_FILE"]).write_text(f"{sum(_LATER.values())}\n")
    else:
        keep = items
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
    if os.geteuid() != 0:
        for item in items:
            mark = _root_only(item)
            if mark is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs root: {mark.args[0]} (run: {ROOT_COMMAND})"))


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """A normal user's run says, before it starts, which tests need root and what they cover."""
    if os.geteuid() == 0:
        return []
    covers = Counter(m.args[0] for i in items if (m := _root_only(i)) is not None)
    if not covers and not _LATER:
        return []
    lines = [f"{sum(covers.values()) + sum(_LATER.values())} test(s) need root (this run's uid is {os.geteuid()}):"]
    lines += [f"  {n:>2} × {what}: skipped in this run" for what, n in sorted(covers.items())]
    lines += [f"  {n:>2} × {what}: run after this one as root of a user namespace"
              for what, n in sorted(_LATER.items())]
    if covers:
        lines.append(f"  the skipped ones run as root: {ROOT_COMMAND}")
    return lines


def _alive_under(root: str) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """Under ``root``, one pass over /proc: (shim pid, process groups) of every supervisor
    shim whose run dir is there, and the pid of every host agent whose `--runs-dir` is."""
    runs, agents = [], []
    for name in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
        if not any(a.startswith(root + os.sep) for a in argv):
            continue
        if "--runs-dir" in argv and any(a.endswith(AGENT_MAIN) for a in argv):
            agents.append(int(name))
        if "supervise" not in argv:
            continue
        run_dir = argv[argv.index("supervise") + 1] if argv.index("supervise") + 1 < len(argv) else ""
        groups = []
        try:
            groups.append(os.getpgid(int(name)))
            groups.append(int(json.loads(Path(run_dir, "manifest.json").read_text())["pgid"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass
        mine = os.getpgid(0)  # never the test session's own group
        runs.append((int(name), [g for g in groups if g > 1 and g != mine]))
    return runs, agents


@pytest.fixture(autouse=True)
def _no_run_left_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves a run alive (a job that sleeps or spins for minutes, loading the
    machine under every later test) fails, naming itself; its run's groups are killed.
    So does one that leaves a host agent of its runs dir alive (a client, an app, a link it
    did not close: the agent waits for its stdin's end, on the sshd's session, until the
    suite ends); the agent is killed."""
    root = str(request.getfixturevalue("tmp_path")) if "tmp_path" in request.fixturenames else None
    yield
    if root is None:
        return
    leaked, agents = _alive_under(root)
    deadline = time.monotonic() + LEAK_GRACE_S
    while (leaked or agents) and time.monotonic() < deadline:  # a run the test just killed is still ending
        time.sleep(0.05)
        leaked, agents = _alive_under(root)
    for _, groups in leaked:
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
    for pid in agents:
        try:
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass
    if leaked:
        shims = ", ".join(str(pid) for pid, _ in leaked)
        pytest.fail(f"{request.node.nodeid} left {len(leaked)} run(s) alive (supervisor shim "
                    f"pid {shims}); killed them now: kill what a test launches", pytrace=False)
    if agents:
        pytest.fail(f"{request.node.nodeid} left {len(agents)} host agent(s) alive (pid "
                    f"{', '.join(map(str, agents))}); killed them now: close the clients and apps a test "
                    "opens", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`eagle3-tui demo` notes the demo's dir in the user's state dir
    (tui/services/statefile.py): the tests' notes go to a temp dir, never the user's."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A running sshd on 127.0.0.1 with throw-away keys; see tests/sshd.py."""
    reason = sshd_missing()
    if reason:  # never a silent skip: ./tests/run installs it when it can
        pytest.fail(reason, pytrace=False)
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[AgentClient]:
    """The real agent (remote/agent/main.py) over LocalLink, started; runs go to tmp_path/runs."""
    c = AgentClient(LocalLink(runs_dir=str(tmp_path / "runs")))
    await c.start()
    yield c
    await c.close()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real single-node Slurm cluster (tests/slurm.py); fails with one line saying what
    to install when slurm-wlm or munge is missing, never skips."""
    why = slurm_missing()
    if why:
        pytest.fail(why, pytrace=False)
    with Cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_accounting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A second real single-node cluster, with Slurm's accounting: its own MariaDB and
    slurmdbd on loopback (tests/slurm.py); fails with one line when they are missing."""
    why = slurm_missing(accounting=True)
    if why:
        pytest.fail(why, pytrace=False)
    with Cluster(tmp_path_factory.mktemp("slurmdbd"), accounting=True) as cluster:
        yield cluster


def _counts(terminalreporter: pytest.TerminalReporter) -> dict[bool, Counter[str]]:
    """Outcomes by test, split into architecture checks (marker `arch`) and the rest."""
    counts: dict[bool, Counter[str]] = {True: Counter(), False: Counter()}
    for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for rep in terminalreporter.stats.get(outcome, []):
            if isinstance(rep, pytest.TestReport) and (rep.when == "call" or outcome != "passed"):
                counts["arch" in rep.keywords][outcome] += 1
    return counts


_SLURM_STORY: list[str] = []  # the Slurm tier's lines, as the test reports brought them


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """The Slurm tier's lines travel with the report of the test that said them: under
    ./tests/run's workers (xdist) the summary is written by another process."""
    outcome = yield
    if SLURM_LINES:
        outcome.get_result().user_properties.extend(("slurm tier", line) for line in SLURM_LINES)
        SLURM_LINES.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SLURM_STORY.extend(str(v) for k, v in report.user_properties if k == "slurm tier")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Behaviour tests counted apart from the parametrized architecture checks; and the
    Slurm tier's story (submit → pending reason → running → kill → GPUs free; a failed
    job's exit code), printed in every run's summary so CI output shows it."""
    counts = _counts(terminalreporter)
    if counts[True] or counts[False]:
        def said(c: Counter[str]) -> str:
            return ", ".join(f"{n} {k}" for k, n in sorted(c.items())) or "none"
        terminalreporter.write_line(f"behaviour tests: {said(counts[False])}; "
                                    f"architecture checks (marker arch): {said(counts[True])}")
    if _SLURM_STORY:
        terminalreporter.section("Slurm tier")
        for line in _SLURM_STORY:
            terminalreporter.write_line(line)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """A plain `pytest` (not ./tests/run) in a partial venv says up front which test
    dependencies are missing and that their tests will skip (tests/need.py)."""
    from tests import need

    return need.header()

