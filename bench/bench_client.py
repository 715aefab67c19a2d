"""What the dashboard costs beside a log viewer and `tail -F` on the same log, in one run.

    python bench/bench_client.py [--case launched|generated|both] [--base CHECKOUT]
                                 [--idle 30] [--steady 60] [--burst 60] [--rss-minutes 10]
                                 [--ssh] [--toolong PATH_TO_tl] [--py-spy PATH] [--serve]
                                 [--profile S] [--aged S] [--history N]

Two cases, each printed as its own rows.

**launched** (the case users live in): a run started with `eagle3-tui launch` whose job
(bench/bench_job.py) writes shard loading, then vLLM-like extraction lines (120-145
characters, one write() each), then a training log, paced by the bench; `eagle3-tui
connect local` follows it in tmux at 160x50, so the runs table, the progress panel, the
process table and the log pane are all live; toolong and `tail -F` follow the run's log
in the same window. Phases: idle (the run alive, quiet), sparse lines (write -> pane),
20 extraction lines/s, the same under py-spy (its top entries are printed; the CPU figure
comes from the phase before, unprofiled), 20 training lines/s, idle once the lines stop,
then (`--aged S`, 30 by default, 0: none) S s idle once the run is over 10 minutes old:
the bench waits for that (~6 min), when the run's clocks show minutes, not seconds.
With `--base CHECKOUT` (e.g. a `git worktree` of main) a second dashboard from that
checkout follows the same run at the same time: before and after under the same load.
With `--serve` the same run is also open in a browser: `eagle3-tui serve local` and one
headless chromium page (Playwright), measured in the same phases: the server and the
session's app (the `connect` process Textual's web driver draws; their sum is the
browser dashboard's server side), its agent, and chromium's processes together. With
`--profile S`, py-spy records the client S s at 20 lines/s (100 Hz) and S s idle at the
end (500 Hz); the top entries are printed, the raw stacks kept. With `--history N` the
host first keeps N ended runs of the same name (each launched with `eagle3-tui launch`,
a command that exits at once), as a host does after weeks of runs: every snapshot
names them and the runs table shows them.

**generated** (the earlier figure): the dashboard follows a log the bench writes itself
(no launched run, so no process rows or run record change):

1. first full frame: seconds from start until every panel and "connected" are on screen;
2. idle: no line written for --idle s; then sparse lines (--sparse, one every 0.5 s): each
   line's time from its write to the pane, for the client and `tail -F` (p50 and max);
3. steady: 20 lines/s for --steady s;
4. burst: 2,000 lines/s for --burst s (vLLM-style lines with tqdm redraws); during it `?`
   is pressed every few seconds and the time until the help screen is on the pane is
   taken, then Escape and the time until it is gone; at its end, how long until the last
   line is on the pane; then the log viewer
   (`L`) must count every line of the file;
5. RSS at 20 lines/s for --rss-minutes, sampled every 10 s, growth extrapolated per hour;
6. a training run's log at 20 lines/s for --train s (Hugging Face Trainer-style metrics
   dicts with a tqdm step bar every tenth line): each line changes the step and loss the
   progress panel shows, and its loss plot (last: from then on the log reads as training);
7. with --ssh, through a real OpenSSH sshd on 127.0.0.1 (tests/sshd.py): OpenSSH's own
   `ssh HOST true` as the peer, the first full frame on a one-line log as in 1. (twice:
   the first connect uploads the agent when this version is new to the host) and on the
   bench's grown log, then idle.

For both, a floor peer runs in the same window: bench/textual_clock.py, a bare Textual
app (eagle3-tui's driver) whose one text changes each second, the least a dashboard
draws each second; an idle dashboard's CPU is read against it ("client / clock").

For both: CPU is the process's own CPU time (utime+stime from /proc, in % of one core over the
phase), not its share of wall time, so other load on the machine changes it less; the
local agent is counted apart from the client. The load averages before and after each
phase are printed with its figures: on a shared machine, read the ratios to the peers
measured in the same phase. The checkout's `tui/` and `remote/` are byte-compiled first,
as an installed wheel is (PYTHONDONTWRITEBYTECODE=1 would otherwise recompile them at
every start).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
SIZE = (160, 50)
HELP_NEEDLE = "watches one run on one host"  # first line of the help screen (tui/views/screens/help.py)


# ---- processes ------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 1e6


def descendant(root: int, needle: bytes) -> int | None:
    """The newest process under `root` (children, grandchildren, ...) whose command line
    holds `needle` (an agent of a connection closed a moment ago may still be exiting)."""
    parent: dict[int, int] = {}
    started: dict[int, int] = {}
    cmds: dict[int, bytes] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                parent[int(d)], started[int(d)] = int(fields[1]), int(fields[19])
                cmds[int(d)] = Path(f"/proc/{d}/cmdline").read_bytes()
            except (OSError, IndexError, ValueError):
                pass
    found = []
    for pid, cmd in cmds.items():
        if needle in cmd:
            p = pid
            while p > 1:
                p = parent.get(p, 0)
                if p == root:
                    found.append(pid)
                    break
    return max(found, key=lambda pid: (started.get(pid, 0), pid)) if found else None


def first_frame(name: str, cmd: str, needles: list[str], what: str, repeat: int = 1,
                cwd: Path = ROOT) -> tuple[Tmux, float | None]:
    """Start `cmd` (an `env … python -m tui.cli …` line) in tmux with a start-up trace,
    `repeat` times (each closed before the next starts); print the seconds from the
    launch until every needle is on the pane, the client's CPU by then, and the breakdown
    by step of the median start. Returns the last session (left running) and the median."""
    starts: list[tuple[float, float, Path, float]] = []  # (seen, cpu, trace, launched)
    dash: Tmux | None = None
    for _ in range(repeat):
        if dash is not None:
            dash.kill()
            time.sleep(1)
        trace = Path(tempfile.mkdtemp(prefix="bench-trace-")) / "trace"
        launched = time.time()
        dash = Tmux(name, cmd.replace("env ", f"env EAGLE3_TUI_TRACE={shlex.quote(str(trace))} ", 1), cwd)
        t = dash.wait(needles, 30)
        starts.append((float("inf") if t is None else time.time() - launched, cpu_s(dash.pid), trace, launched))
    assert dash is not None
    seen, cpu, trace, launched = sorted(starts, key=lambda s: s[0])[len(starts) // 2]
    median = None if seen == float("inf") else seen
    every = ", ".join(fmt(s[0]) for s in starts)
    print(f"first full frame after connect ({what}): {fmt(median)} s wall from the launch"
          + (f" (median of {repeat}: {every})" if repeat > 1 else "") + f", {cpu:.2f} s of the client's CPU")
    print(breakdown(trace, launched, median))
    return dash, median


class Tmux:
    def __init__(self, name: str, cmd: str, cwd: Path = ROOT) -> None:
        """`cwd`: the checkout whose `tui` runs (`python -m` puts the working directory
        before PYTHONPATH on sys.path)."""
        self.name = f"bc-{name}-{uuid.uuid4().hex[:6]}"
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(SIZE[0]), "-y", str(SIZE[1]),
                        "-c", str(cwd), "exec " + cmd], check=True)
        subprocess.run(["tmux", "set-option", "-t", self.name, "remain-on-exit", "on"], check=True)
        out = subprocess.run(["tmux", "list-panes", "-t", self.name, "-F", "#{pane_pid}"],
                             capture_output=True, text=True, check=True).stdout
        self.pid = int(out.split()[0])  # `exec`: the pane's process is the program itself

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def wait(self, needles: list[str], timeout: float, gone: bool = False) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            text = self.screen()
            if all((n in text) != gone for n in needles):
                return time.monotonic() - t0
            time.sleep(0.01)
        return None

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


# ---- the log ----------------------------------------------------------------------------
class Writer:
    """Appends vLLM-like lines (or, with `train`, a training loop's) at a set rate, in
    10 ms batches; counts what it wrote."""

    def __init__(self, path: Path) -> None:
        self.path, self.lines, self.rate, self.train = path, 0, 0.0, False
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._rng = random.Random(7)
        self._t.start()

    def line(self) -> str:
        n = self.lines + 1
        if self.train:
            if n % 10 == 0:
                return f" {n // 100:2d}%|{'█' * (n // 500):<20}| {n}/10000 [00:{n % 60:02d}<09:00, 20.0it/s]"
            return (f"{{'loss': {2 / (1 + n / 500) + self._rng.uniform(0, 0.05):.4f}, 'grad_norm': "
                    f"{self._rng.uniform(0.5, 2):.3f}, 'learning_rate': 2e-05, 'epoch': {n / 10000:.2f}}}")
        if n % 10 == 0:
            pct = n % 100
            return (f"(Worker_TP{n % 8} pid={1000 + n % 8}) Processed prompts: {pct:3d}%|{'█' * (pct // 5):<20}| "
                    f"{n}/{n + 1000} [00:{n % 60:02d}<01:00, {self._rng.uniform(1, 9):.2f}it/s]")
        return (f"INFO 12-01 04:{n // 60 % 60:02d}:{n % 60:02d} [engine.py:{n % 900}] line {n}: "
                f"Avg prompt throughput: {self._rng.uniform(0, 9e3):.1f} tokens/s, Running: {n % 64} reqs, "
                f"GPU KV cache usage: {self._rng.uniform(0, 100):.1f}%")

    def _loop(self) -> None:
        carry, last = 0.0, time.monotonic()
        with open(self.path, "a", buffering=1 << 20) as f:
            while not self._stop.is_set():
                time.sleep(0.01)
                now = time.monotonic()
                carry += self.rate * (now - last)
                last = now
                n = int(carry)
                if n:
                    carry -= n
                    f.write("".join(self.line_and_count() for _ in range(n)))
                    f.flush()

    def line_and_count(self) -> str:
        text = self.line() + "\n"
        self.lines += 1
        return text

    def write_marker(self, text: str) -> None:
        with open(self.path, "a") as f:
            f.write(text + "\n")
        self.lines += 1

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


# ---- measuring ----------------------------------------------------------------------------
class Procs:
    """The measured processes by label, and CPU seconds over a phase."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.groups: dict[str, list[int]] = {}  # a label for several processes, summed (chromium's)
        self.loads: list[tuple[str, str]] = []  # (before, after) of each phase

    def cpu(self) -> dict[str, float]:
        out = {}
        for label, pid in self.pids.items():
            try:
                out[label] = cpu_s(pid)
            except OSError:
                out[label] = float("nan")
        for label, pids in self.groups.items():
            out[label] = sum(_cpu_or_0(pid) for pid in pids)
        return out

    def phase(self, seconds: float, during: object = None) -> dict[str, float]:
        """% of one core per process over `seconds` (CPU time / wall time); the load
        averages before and after go to `self.loads`."""
        before, c0, t0 = load(), self.cpu(), time.monotonic()
        if callable(during):
            during()
        time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        c1, wall = self.cpu(), time.monotonic() - t0
        self.loads.append((before, load()))
        return {k: 100 * (c1[k] - c0[k]) / wall for k in c0}


def _cpu_or_0(pid: int) -> float:
    try:
        return cpu_s(pid)
    except OSError:  # a chromium helper that ended
        return 0.0


class ServeSession:
    """`eagle3-tui serve local` from `tree` and one headless chromium page (1440x900,
    the page bench/bench_serve.py uses) on its URL, in a thread of its own that keeps
    Playwright's connection read (its events would otherwise queue up) until `stop`."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]

    def __init__(self, tree: Path, cfg: Path, work: Path) -> None:
        self.out, self.err = work / "serve.out", work / "serve.err"
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.server = subprocess.Popen([sys.executable, "-m", "tui.cli", "--config", str(cfg), "serve", "local",
                                            "--port", "0"], cwd=tree, stdout=o, stderr=e,
                                           env={**os.environ, "PYTHONPATH": str(tree)})
        self.chromium: list[int] = []
        self.ready, self.stopping = threading.Event(), threading.Event()
        self.failed = ""
        self._t = threading.Thread(target=self._page, daemon=True)
        self._t.start()

    def _page(self) -> None:
        try:
            from playwright.sync_api import sync_playwright

            t0 = time.monotonic()
            while not self.out.read_text().strip():
                if self.server.poll() is not None or time.monotonic() - t0 > 30:
                    raise RuntimeError(f"serve did not start: {self.err.read_text()[-300:]}")
                time.sleep(0.05)
            url = self.out.read_text().split()[0]
            with sync_playwright() as pw:
                before = set(_chromium_pids())
                browser = pw.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                             args=self.FLAGS)
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                page.goto(url)
                page.wait_for_selector("body.-first-byte", state="attached", timeout=30_000)
                page.click("#terminal")
                self.chromium = [q for q in _chromium_pids() if q not in before]
                self.ready.set()
                while not self.stopping.is_set():
                    page.wait_for_timeout(250)
                browser.close()
        except Exception as exc:  # noqa: BLE001 - said in the table's place, the other rows still stand
            self.failed = f"{type(exc).__name__}: {exc}"[:300]
            self.ready.set()

    def stop(self) -> None:
        self.stopping.set()
        self._t.join(30)
        self.server.terminate()
        try:
            self.server.wait(15)
        except subprocess.TimeoutExpired:
            self.server.kill()


def _chromium_pids() -> list[int]:
    mine = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if b"chromium" in Path(f"/proc/{d}/cmdline").read_bytes():
                    mine.append(int(d))
    return mine


def peers(args: argparse.Namespace, log: Path, sessions: list[Tmux], procs: Procs) -> Tmux:
    """toolong (when given) and `tail -F` on the same log in the same window, measured
    beside the dashboard; back once every viewer has read the file and settled, with the
    `tail -F` pane (the latency peer)."""
    if args.toolong:
        tl = Tmux("tl", f"{shlex.quote(args.toolong)} {shlex.quote(str(log))}")
        sessions.append(tl)
        procs.pids["toolong"] = tl.pid
    tail = Tmux("tail", f"tail -F {shlex.quote(str(log))}")
    sessions.append(tail)
    procs.pids["tail -F"] = tail.pid
    clock = Tmux("clock", f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'bench' / 'textual_clock.py'))}")
    sessions.append(clock)
    procs.pids[CLOCK] = clock.pid
    time.sleep(5)
    return tail


def load() -> str:
    """The 1, 5 and 15 minute load averages, for the record beside every phase."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def breakdown(trace: Path, launched: float, seen: float | None) -> str:
    """The client's start-up milestones (tui/trace.py), in seconds since the launch,
    each with the time since the one before; the last step is the frame on the pane."""
    try:
        marks = [(float(t), step) for t, step in (ln.split(" ", 1) for ln in trace.read_text().splitlines())]
    except (OSError, ValueError):
        return "  (no trace)"
    if seen is not None:
        marks.append((launched + seen, "full frame on the pane"))
    out, prev = [], launched
    for t, step in sorted(marks):
        out.append(f"  {t - launched:5.2f} s  (+{t - prev:4.2f})  {step}")
        prev = t
    return "\n".join(out)


def fmt(v: float | None, spec: str = "{:.2f}") -> str:
    return "N/A" if v is None or v != v else spec.format(v)


def row(name: str, figures: dict[str, float], order: list[str]) -> None:
    print(f"| {name} | " + " | ".join(fmt(figures.get(k)) for k in order) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--idle", type=float, default=30)
    ap.add_argument("--steady", type=float, default=60)
    ap.add_argument("--burst", type=float, default=60)
    ap.add_argument("--rss-minutes", type=float, default=10)
    ap.add_argument("--train", type=float, default=60, help="seconds of training-log lines at 20 lines/s, last")
    ap.add_argument("--sparse", type=int, default=20, help="lines written one every 0.5 s for the latency phase")
    ap.add_argument("--ssh", action="store_true", help="also measure idle over loopback SSH")
    ap.add_argument("--first-frame-only", action="store_true",
                    help="only the first frames (local, and with --ssh over SSH; the log then grown to 20 MB"
                         " at once), with their breakdown")
    ap.add_argument("--toolong", default=shutil.which("tl"), help="path of toolong's `tl`")
    ap.add_argument("--case", choices=("launched", "generated", "both"), default="both")
    ap.add_argument("--base", type=Path, help="launched case: also a dashboard from this checkout, at the same time")
    ap.add_argument("--serve", action="store_true",
                    help="launched case: also the run in a browser (eagle3-tui serve, one headless chromium page)")
    ap.add_argument("--profile", type=float, default=20, help="launched case: seconds of py-spy at 20 lines/s")
    ap.add_argument("--aged", type=float, default=30,
                    help="launched case: seconds of idle once the run is over 10 min old (its clocks then show"
                         " minutes; the bench waits for that moment), last; 0: none")
    ap.add_argument("--history", type=int, default=0,
                    help="launched case: ended runs of the same name the host keeps before the measured one")
    ap.add_argument("--py-spy", dest="py_spy", default=shutil.which("py-spy"), help="path of py-spy")
    args = ap.parse_args()
    if not shutil.which("tmux"):
        print("tmux not found", file=sys.stderr)
        return 2
    # An installed wheel has its bytecode compiled; a checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would compile every module at each start instead.
    import compileall

    for tree in [ROOT] + ([args.base] if args.base else []):
        for pkg in ("tui", "remote"):
            compileall.compile_dir(str(tree / pkg), quiet=1)
    if args.case in ("launched", "both"):
        launched_case(args)
    if args.case in ("generated", "both"):
        return generated_case(args)
    return 0


def generated_case(args: argparse.Namespace) -> int:
    """The dashboard following a log the bench writes (the case measured first)."""
    print("\n## generated log (the bench writes the file; no launched run)\n")
    work = Path(tempfile.mkdtemp(prefix="bench-client-"))
    log = work / "run.log"
    log.write_text("INFO 12-01 04:00:00 [loader.py:1] Starting to load model /models/bench...\n")
    cfg = work / "eagle3.toml"
    cfg.write_text(f'[host]\nruns_dir = "{work / "runs"}"\n[run]\nname = "bench"\nlog = "{log}"\n'
                   f'match = "no-such-thing-{uuid.uuid4().hex}"\n')
    py = shlex.quote(sys.executable)
    env = f"PYTHONPATH={shlex.quote(str(ROOT))}"
    client_cmd = f"env {env} {py} -m tui.cli --config {shlex.quote(str(cfg))} connect local"
    writer = Writer(log)
    procs = Procs()
    sessions: list[Tmux] = []
    order = ["client", "agent", "toolong", "tail -F", CLOCK]
    results: dict[str, dict[str, float]] = {}
    try:
        dash, _ = first_frame("dash", client_cmd, ["Runs", "GPUs", "Processes", "Log", "Progress", "connected",
                                                   "Starting to load"], "local, one-line log", 3)
        sessions.append(dash)
        if args.first_frame_only:  # the log as long as a full run leaves it (~20 MB), at once
            with open(log, "a") as f:
                while f.tell() < 20e6:
                    f.write("".join(writer.line_and_count() for _ in range(1000)))
            raise _FirstFrameOnly
        procs.pids["client"] = dash.pid
        agent = None
        for _ in range(50):
            agent = descendant(dash.pid, b"agent/main.py")
            if agent:
                break
            time.sleep(0.1)
        if agent:
            procs.pids["agent"] = agent
        tail = peers(args, log, sessions, procs)

        print(f"\nmachine: {os.cpu_count()} cores, load {load()} (1/5/15 min) at start; pids {procs.pids}")
        results["idle"] = procs.phase(args.idle)
        sparse = sparse_latency(writer.write_marker, {"client": dash, "tail -F": tail}, args.sparse)
        writer.rate = 20
        time.sleep(2)
        results["20 lines/s"] = procs.phase(args.steady)

        # burst
        writer.rate = 2000
        keys: list[float] = []
        closes: list[float] = []

        def press_keys() -> None:
            end = time.monotonic() + args.burst - 3
            time.sleep(3)
            while time.monotonic() < end - 2:
                dash.keys("?")
                t = dash.wait([HELP_NEEDLE], 5)
                keys.append(t if t is not None else float("inf"))
                dash.keys("Escape")
                t = dash.wait([HELP_NEEDLE], 5, gone=True)
                closes.append(t if t is not None else float("inf"))
                time.sleep(2)

        results["2,000 lines/s"] = procs.phase(args.burst, press_keys)
        burst_lines = writer.lines
        writer.rate = 0
        time.sleep(0.05)
        marker = f"burst-end-{uuid.uuid4().hex[:8]}"
        writer.write_marker(marker)
        behind = dash.wait([marker], 30)
        if behind is None:
            print("!! the line written after the burst is not on the pane; the pane:\n" + dash.screen())
        total = log.read_bytes().count(b"\n")
        dash.keys("L")
        seen_all = dash.wait([f"of {total}"], 60)
        shown = dash.screen()
        dash.keys("Escape")
        # rss
        writer.rate = 20
        samples: list[tuple[float, dict[str, float]]] = []
        t_end = time.monotonic() + args.rss_minutes * 60
        while time.monotonic() < t_end:
            s: dict[str, float] = {}
            for label, pid in procs.pids.items():
                try:
                    s[label] = rss_mb(pid)
                except OSError:
                    pass
            samples.append((time.monotonic(), s))
            time.sleep(10)
        writer.rate = 0
        if args.train:
            writer.train, writer.rate = True, 20
            time.sleep(2)
            results["20 training lines/s"] = procs.phase(args.train)
            writer.rate = 0
            if "loss" not in dash.screen():
                print("!! the progress panel shows no loss; the pane:\n" + dash.screen())
    except _FirstFrameOnly:
        pass
    finally:
        writer.stop()
        for s in sessions:
            if not Path(f"/proc/{s.pid}").exists():
                print(f"\n!! {s.name} exited early; its last screen:\n{s.screen()}")
            s.kill()
    ssh_procs = Procs()
    if args.ssh:  # alone: only one agent.py from an uploaded copy runs now
        results["idle over SSH"] = ssh_idle(cfg, 0 if args.first_frame_only else args.idle, py, env, ssh_procs)
    if args.first_frame_only:
        return 0

    print(f"\nload at end {load()}; log lines written {writer.lines:,} ({burst_lines:,} by the burst's end)")
    print_table(results, procs.loads + ssh_procs.loads, order)
    print_sparse(sparse, args.sparse)
    print("\nburst (2,000 lines/s):")
    for what, times in (("`?` -> help on the pane", keys), ("Escape -> dashboard back", closes)):
        finite = sorted(k for k in times if k != float("inf"))
        if times:
            print(f"  key {what}: n={len(times)}, "
                  f"median {fmt(1000 * finite[len(finite) // 2] if finite else None, '{:.0f}')} ms,"
                  f" max {fmt(1000 * max(times), '{:.0f}')} ms")
    print(f"  pane behind the file at the burst's end: {fmt(behind)} s"
          " (until the line written after the burst is shown)")
    print(f"  log viewer counts every line ({total:,}): {'yes' if seen_all is not None else 'NO'}")
    if seen_all is None:
        print("  viewer status line: " + next((ln for ln in shown.splitlines() if "lines" in ln), "?").strip())
    print(f"\nRSS at 20 lines/s over {args.rss_minutes:g} min, MB (first, last, growth per hour by least squares):\n")
    print("| process | first | last | MB/hour |")
    print("|---|---:|---:|---:|")
    for label in procs.pids:
        pts = [(t, s[label]) for t, s in samples if label in s]
        if len(pts) < 2:
            continue
        slope = _slope(pts) * 3600
        print(f"| {label} | {pts[0][1]:.1f} | {pts[-1][1]:.1f} | {slope:+.1f} |")
    return 0


def print_sparse(sparse: dict[str, list[float]], n: int) -> None:
    print(f"\nsparse lines (one every 0.5 s, n={n}): write -> on the pane, ms")
    for label, times in sparse.items():
        finite = sorted(t for t in times if t != float("inf"))
        p50 = finite[len(finite) // 2] if finite else None
        print(f"  {label}: p50 {fmt(None if p50 is None else 1000 * p50, '{:.0f}')},"
              f" max {fmt(1000 * max(times) if times else None, '{:.0f}')}")


def print_table(results: dict[str, dict[str, float]], loads: list[tuple[str, str]], order: list[str]) -> None:
    """CPU per phase and process, the ratios to the peers (and to the base checkout's
    dashboard when there is one) and the load averages around each phase."""
    base = "client@base" in order
    print("\nCPU, % of one core (process CPU time / wall time); load 1/5/15 min before -> after each phase:\n")
    print("| phase | " + " | ".join(order) + " | client / toolong | client / tail -F | client / clock |"
          + (" client / client@base |" if base else "") + " load |")
    print("|---|" + "---:|" * (len(order) + 3 + base) + "---|")
    for (phase, fig), (l0, l1) in zip(results.items(), loads):
        c = fig.get("client")

        def ratio(peer: str) -> float | None:
            other = fig.get(peer)
            return c / other if c is not None and other else None

        print(f"| {phase} | " + " | ".join(fmt(fig.get(k)) for k in order)
              + f" | {fmt(ratio('toolong'))} | {fmt(ratio('tail -F'), '{:.0f}')} | {fmt(ratio(CLOCK))} |"
              + (f" {fmt(ratio('client@base'))} |" if base else "") + f" {l0} -> {l1} |")


SERVED = ("served: server+session", "serve", "serve session", "agent@serve")
CLOCK = "Textual clock"  # the floor peer: bench/textual_clock.py


def served(cfg: Path, work: Path, procs: Procs) -> ServeSession:
    """The launched run in a browser too: `eagle3-tui serve local` and one chromium page;
    its processes join `procs` (the server, the session's app, its agent, chromium)."""
    serve = ServeSession(ROOT, cfg, work)
    serve.ready.wait(90)
    if serve.failed or not serve.ready.is_set():
        print(f"!! the browser session did not start: {serve.failed or 'no page within 90 s'}")
        return serve
    session = agent = None
    for _ in range(100):
        session = descendant(serve.server.pid, b"connect")
        agent = descendant(session, b"agent/main.py") if session else None
        if agent:
            break
        time.sleep(0.1)
    procs.pids["serve"] = serve.server.pid
    if session:
        procs.pids["serve session"] = session
    if agent:
        procs.pids["agent@serve"] = agent
    procs.groups["chromium"] = serve.chromium
    time.sleep(3)  # past the session's start-up
    return serve


def history(cfg: Path, work: Path, n: int) -> None:
    """`n` ended runs of the config's run name on the host, one after another."""
    quick = work / "history.toml"
    quick.write_text(cfg.read_text().replace("command = ", 'command = ["true"]\n# was: ', 1))

    def e3(*argv: str) -> str:
        return subprocess.run([sys.executable, "-m", "tui.cli", "--config", str(quick), *argv, "local", "--json"],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                              check=True, timeout=60, cwd=ROOT).stdout

    for _ in range(n):
        e3("launch")
        deadline = time.monotonic() + 30
        while any(r.get("state") == "running" for r in json.loads(e3("runs"))["runs"]):  # one of a name at a time
            if time.monotonic() > deadline:
                raise SystemExit("a history run did not end in 30 s")
            time.sleep(0.1)
    print(f"history: {n} ended runs of the same name on the host before the measured one")


def launched_case(args: argparse.Namespace) -> None:
    """A run launched with `eagle3-tui launch`, its job paced through a FIFO
    (bench/bench_job.py), followed by the dashboard (and, with --base, by the base
    checkout's dashboard at the same time), toolong and `tail -F`."""
    print("\n## launched run (eagle3-tui launch; the dashboard follows it)\n")
    work = Path(tempfile.mkdtemp(prefix="bench-launched-"))
    fifo = work / "ctl"
    os.mkfifo(fifo)
    cfg = work / "eagle3.toml"
    argv = [sys.executable, str(ROOT / "bench" / "bench_job.py"), str(fifo)]
    cfg.write_text(f'[host]\nruns_dir = "{work / "runs"}"\n[run]\nname = "bench-launched"\n'
                   f"command = {json.dumps(argv)}\n")
    py = shlex.quote(sys.executable)
    trees = {"client": ROOT, **({"client@base": args.base.resolve()} if args.base else {})}
    if args.history:
        history(cfg, work, args.history)
    launched = subprocess.run([sys.executable, "-m", "tui.cli", "--config", str(cfg), "launch", "local", "--json"],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
    if launched.returncode:
        raise SystemExit(f"eagle3-tui launch failed: {launched.stderr.strip()}")
    record = json.loads(launched.stdout)
    log, launched_at = Path(record["log"]), float(record["launched_at"])
    ctl = open(fifo, "w", buffering=1)  # noqa: SIM115 - open for the whole case

    def send(cmd: str) -> None:
        ctl.write(cmd + "\n")
        ctl.flush()

    procs, sessions, dashes = Procs(), [], {}
    order = [*trees, *(f"agent{label[6:]}" for label in trees), "toolong", "tail -F", CLOCK]
    if args.serve:
        order += [*SERVED, "chromium"]
    serve: ServeSession | None = None
    results: dict[str, dict[str, float]] = {}
    sparse: dict[str, list[float]] = {}
    profile = idle_profile = aged_profile = ""
    rss: RssSampler | None = None
    try:
        for label, tree in trees.items():
            cmd = (f"env PYTHONPATH={shlex.quote(str(tree))} {py} -m tui.cli --config {shlex.quote(str(cfg))}"
                   " connect local")
            dash, _ = first_frame(label.replace("@", "-"), cmd, ["Runs", "GPUs", "Processes", "Progress",
                                                                  "connected", "Loading safetensors"],
                                  f"{label}, a launched run", 1, tree)
            sessions.append(dash)
            dashes[label] = dash
            procs.pids[label] = dash.pid
            for _ in range(50):
                agent = descendant(dash.pid, b"agent/main.py")
                if agent:
                    procs.pids[f"agent{label[6:]}"] = agent
                    break
                time.sleep(0.1)
        if args.serve:
            serve = served(cfg, work, procs)
        tail = peers(args, log, sessions, procs)
        rss = RssSampler(procs, list(trees))
        print(f"\nmachine: {os.cpu_count()} cores, load {load()} (1/5/15 min) at start; pids {procs.pids}")
        for label in trees:  # which checkout each dashboard runs: its agent's path says
            agent_pid = procs.pids.get(f"agent{label[6:]}")
            if agent_pid:
                args_ = Path(f"/proc/{agent_pid}/cmdline").read_bytes().split(b"\0")
                print(f"  {label}: agent {next((a.decode() for a in args_ if a.endswith(b'agent/main.py')), '?')}")
        results["launched: idle, run alive"] = procs.phase(args.idle)
        sparse = sparse_latency(lambda marker: send(f"marker {marker}"), {**dashes, "tail -F": tail}, args.sparse)
        send("rate 20")
        time.sleep(2)
        results["launched: 20 extraction lines/s"] = procs.phase(args.steady)
        if args.py_spy and args.profile:
            profile = py_spy(args.py_spy, dashes["client"].pid, args.profile, work)
        send("mode train")
        time.sleep(2)
        results["launched: 20 training lines/s"] = procs.phase(args.train)
        send("rate 0")
        time.sleep(3)
        results["launched: idle after the lines"] = procs.phase(args.idle)
        if args.py_spy and args.profile:
            idle_profile = py_spy(args.py_spy, dashes["client"].pid, args.profile, work, rate=IDLE_RATE)
        if args.aged:
            # A long run spends most of its life older than 10 min: its DURATION and its
            # processes' ELAPSED show minutes then, and an idle screen repaints once a minute.
            wait = launched_at + AGED_S - time.time()
            if wait > 0:
                print(f"(waiting {wait:.0f} s until the run is {AGED_S:.0f} s old)", flush=True)
                time.sleep(wait)
            results["launched: idle, run over 10 min old"] = procs.phase(args.aged)
            if args.py_spy and args.profile:
                aged_profile = py_spy(args.py_spy, dashes["client"].pid, args.profile, work, rate=IDLE_RATE)
        bars = re.findall(r"\| (\d+)/20000 \[", log.read_text())
        step = bars[-1] if bars else "?"
        for label, dash in dashes.items():
            if f"step {step}/" not in dash.screen():
                print(f"!! {label}: the progress panel does not show step {step} (the log's last bar)")
        send("end")
    finally:
        for s in sessions:
            if not Path(f"/proc/{s.pid}").exists():
                print(f"\n!! {s.name} exited early; its last screen:\n{s.screen()}")
            s.kill()
        if serve is not None:
            serve.stop()
        with contextlib.suppress(OSError):
            send("end")
            ctl.close()
    for fig in results.values():  # the browser dashboard's server side: the server and the session's app
        if "serve" in fig and "serve session" in fig:
            fig[SERVED[0]] = fig["serve"] + fig["serve session"]
    print_table(results, procs.loads, order)
    print_sparse(sparse, args.sparse)
    if rss is not None:
        rss.report("the launched case, every phase")
    if profile:
        print(f"\nprofile of the client at 20 extraction lines/s (py-spy, {args.profile:g} s, 100 Hz):\n{profile}")
    if idle_profile:
        print(f"\nprofile of the client idle, the run alive (py-spy, {args.profile:g} s, {IDLE_RATE} Hz):\n"
              f"{idle_profile}")
    if aged_profile:
        print(f"\nprofile of the client idle, the run over 10 min old (py-spy, {args.profile:g} s, {IDLE_RATE} Hz):\n"
              f"{aged_profile}")


AGED_S = 605.0  # the run's age for the aged idle phase: past the 10 minutes its clocks show seconds for
IDLE_RATE = 500  # Hz: an idle client is on the CPU ~1 % of the time, so 100 Hz gives too few samples


def py_spy(exe: str, pid: int, seconds: float, work: Path, top: int = 15, rate: int = 100) -> str:
    """`py-spy record` of `pid` (not paused: --nonblocking); the top entries by own
    samples and by samples with the function on the stack, in % of the samples taken.
    The raw stacks are kept (their path is printed) for a closer look."""
    out = work / f"profile-{rate}hz-{int(time.time())}.txt"
    done = subprocess.run([exe, "record", "--nonblocking", "-r", str(rate), "-d", str(int(seconds)), "-f", "raw",
                           "-o", str(out), "-p", str(pid)], capture_output=True, text=True)
    if done.returncode or not out.exists():
        return f"(py-spy failed: {done.stderr.strip()[-300:]})"
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = waiting = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or not stack:
            continue
        frames = [_frame(f) for f in stack.split(";")]
        if frames[-1].split(" ")[0].rsplit(".", 1)[-1] in IDLE_LEAVES:
            waiting += int(count)  # py-spy calls a thread in select() or a lock's wait active
            continue
        total += int(count)
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for f in set(frames):
            if "tui/" in f or "textual/" in f or "rich/" in f:
                inclusive[f] = inclusive.get(f, 0) + int(count)
    if not total:
        return "(no samples: the client was idle)"
    lines = [f"{total} samples on the CPU = {total / seconds:.0f} per second at {rate} Hz (raw stacks: {out})"
             f" ({waiting} more waiting in select() or on a lock, left out)", "own time:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]]
    lines.append("with callees (tui, textual, rich):")
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:2 * top]]
    return "\n".join(lines)


IDLE_LEAVES = {"select", "poll", "wait", "sleep", "notify", "acquire", "_wait_for_tstate_lock"}


def _frame(raw: str) -> str:
    """`func (…/pkg/file.py:12)` as `func (pkg/file.py)`."""
    func, _, where = raw.partition(" (")
    path = where.rsplit(":", 1)[0]
    return f"{func} ({'/'.join(path.split('/')[-2:])})" if where else func


def sparse_latency(write: Callable[[str], None], panes: dict[str, Tmux], n: int) -> dict[str, list[float]]:
    """Write `n` marked lines 0.5 s apart; for each pane, the seconds from each write until
    the line is on it (inf: not within 5 s)."""
    out: dict[str, list[float]] = {label: [] for label in panes}
    for _ in range(n):
        marker = f"sparse-{uuid.uuid4().hex[:10]}"
        t0 = time.monotonic()
        write(marker)
        waiting = dict(panes)
        while waiting and time.monotonic() - t0 < 5:
            for label, pane in list(waiting.items()):
                if marker in pane.screen():
                    out[label].append(time.monotonic() - t0)
                    del waiting[label]
            time.sleep(0.005)
        for label in waiting:
            out[label].append(float("inf"))
        time.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))
    return out


class _FirstFrameOnly(Exception):
    """--first-frame-only: the phases after the first frame are skipped."""


def _slope(pts: list[tuple[float, float]]) -> float:
    n = len(pts)
    mx = sum(t for t, _ in pts) / n
    my = sum(v for _, v in pts) / n
    den = sum((t - mx) ** 2 for t, _ in pts)
    return sum((t - mx) * (v - my) for t, v in pts) / den if den else 0.0


class RssSampler:
    """RSS of the measured processes every `every` s in a thread, for a whole case."""

    def __init__(self, procs: Procs, labels: list[str], every: float = 10.0) -> None:
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(procs, labels, every), daemon=True)
        self._thread.start()

    def _loop(self, procs: Procs, labels: list[str], every: float) -> None:
        while True:
            got = {}
            for label in labels:
                with contextlib.suppress(OSError, KeyError):
                    got[label] = rss_mb(procs.pids[label])
            self.samples.append((time.monotonic(), got))
            if self._stop.wait(every):
                return

    def report(self, what: str) -> None:
        self._stop.set()
        self._thread.join()
        if len(self.samples) < 2:
            return
        minutes = (self.samples[-1][0] - self.samples[0][0]) / 60
        print(f"\nRSS over {what} ({minutes:.1f} min, every 10 s), MB: first, peak, last, growth per hour"
              " by least squares over the second half (past the start-up)\n")
        print("| process | first | peak | last | MB/hour |\n|---|---:|---:|---:|---:|")
        for label in self.samples[-1][1]:
            pts = [(t, got[label]) for t, got in self.samples if label in got]
            late = pts[len(pts) // 2:]
            slope = _slope(late) * 3600 if len(late) >= 2 else 0.0
            print(f"| {label} | {pts[0][1]:.1f} | {max(v for _, v in pts):.1f} | {pts[-1][1]:.1f} | {slope:+.1f} |")


def ssh_idle(cfg: Path, seconds: float, py: str, env: str, p: Procs) -> dict[str, float]:
    """First frame and idle client and agent through a real OpenSSH sshd on 127.0.0.1,
    beside OpenSSH's own `ssh HOST true` (handshake, auth, the login shell) as the peer.

    The first frame is taken as it is locally (a one-line log: the run just started),
    twice (the first connect uploads the agent when this version is new to the host),
    then with the bench's own log, by now ~20 MB, of which the last 4 MiB are read first."""
    from tests.sshd import Sshd

    fresh = cfg.parent / "fresh"
    fresh.mkdir(exist_ok=True)
    (fresh / "run.log").write_text("INFO 12-01 04:00:00 [loader.py:1] Starting to load model /models/bench...\n")
    small = fresh / "eagle3.toml"
    small.write_text(cfg.read_text().replace(str(cfg.parent / "run.log"), str(fresh / "run.log")))
    with Sshd() as sshd:
        ssh_true = []
        for _ in range(3):
            t0 = time.monotonic()
            subprocess.run(["ssh", "-F", str(sshd.ssh_config), sshd.alias, "true"], check=True,
                           stdin=subprocess.DEVNULL, capture_output=True)
            ssh_true.append(time.monotonic() - t0)
        peer = sorted(ssh_true)[1]
        print(f"`ssh {sshd.alias} true` (OpenSSH, median of 3): {peer:.2f} s wall")
        dash: Tmux | None = None
        size = cfg.parent.joinpath("run.log").stat().st_size / 1e6
        for attempt, conf, repeat in (("first connect", small, 1), ("again, agent on the host", small, 5),
                                      (f"the bench's {size:.0f} MB log", cfg, 3)):
            if dash is not None:
                dash.kill()
                time.sleep(1)
            cmd = (f"env {env} {py} -m tui.cli -F {shlex.quote(str(sshd.ssh_config))} "
                   f"--config {shlex.quote(str(conf))} connect {sshd.alias}")
            last = conf.parent.joinpath("run.log").read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1].decode()[:60]
            dash, t = first_frame("ssh", cmd, ["Runs", "GPUs", "Processes", "Log", "connected", last],
                                  f"loopback SSH, {attempt}", repeat)
            print(f"  = {fmt(t / peer if t else None)}x `ssh true`")
        assert dash is not None
        try:
            p.pids["client"] = dash.pid
            agent = None
            for _ in range(50):
                agent = descendant(sshd.proc.pid, b"agent/main.py") if sshd.proc else None
                if agent:
                    break
                time.sleep(0.1)
            if agent:
                p.pids["agent"] = agent
            time.sleep(3)
            print(f"\nidle over SSH: pids {p.pids}")
            return p.phase(seconds)
        finally:
            dash.kill()


if __name__ == "__main__":
    sys.exit(main())
