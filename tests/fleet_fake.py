"""Fake fleet hosts: N SSH servers (asyncssh) on loopback that speak the agent protocol.

    python tests/fleet_fake.py serve --hosts 256 --dir DIR   # `ready N` on stdout, then serves
    python tests/fleet_fake.py record                         # re-records FIXTURE from the real agent

`serve` listens on one loopback port per host, so every host is its own SSH connection,
and writes DIR/hosts (one target a line: `f000@127.0.0.1:PORT`, the user names the
host) and DIR/ssh_config (one `Host 127.0.0.1` block: key and known_hosts), for
`eagle3-tui -F DIR/ssh_config connect --hosts-file DIR/hosts`. One small block, as a
real fleet's `Host gpu-*` would be: a config of 256 blocks costs the client a parse
of all of them per host (asyncssh), a cost of the loopback set-up, not of a fleet. Each host answers the
client the way a host with the real agent does:

- the start command (`sh -c …`, tui/transport/hostpython.py): the interpreter line and
  STARTED when DIR/home holds a complete upload for that content hash, else PROBED;
- SFTP (rooted at DIR/home, shared by every fake host) for the upload, then the trust
  check (`ok`) and the start after the upload;
- then the agent protocol (remote/agent/main.py): the recorded hello, `configure` (result,
  then a snapshot at once and one every `interval`), `snapshot`, `runs`, `subscribe`
  (the tail of a recorded log, in `log` chunks as remote/agent/follow.py sends them),
  `unsubscribe`, `read_range`, `file_read`, `outcomes`; any other op gets a one-line
  error naming it (the fleet screen sends none other).

Snapshots are replays of FIXTURE: shapes recorded from the real agent on this machine
with a stand-in `nvidia-smi` of 8 H200 cards (as tests/test_agent.py stands in GPUs),
each host on one shape (i % shapes), its own hostname and its own per-tick jitter of
load, memory, temperature and power. The servers cost their own process's CPU, so a
client measured against them pays only for itself.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT / "tests" / "fixtures" / "fleet_snapshots.json"
CHUNK = 256 * 1024  # remote/agent/follow.py's chunk of log data
READ_RANGE_MAX = 4 * 1024 * 1024


def load_fixture(path: Path = FIXTURE) -> dict[str, Any]:
    return json.loads(path.read_text())


# ---------------------------------------------------------------------- one host's data


class HostData:
    """What host `i` shows: its hello, its shape's snapshot with per-tick jitter, its logs."""

    def __init__(self, fixture: dict[str, Any], i: int, shape: str | None = None) -> None:
        names = sorted(fixture["shapes"])
        self.i = i
        self.shape = shape or names[i % len(names)]
        self.hostname = f"fake-{i:03d}"
        self.template = fixture["shapes"][self.shape]
        self.hello = dict(fixture["hello"], hostname=self.hostname, pid=10000 + i)
        self.files = {p: base64.b64decode(b) for p, b in fixture["files"].items()}
        self.inodes = {p: 1000 + n for n, p in enumerate(sorted(self.files))}
        self.shift = time.time() - float(self.template["time"])  # recorded times, moved to now
        # each host its own run ids, as remote/run/launch.py makes them (the launch time moved to now)
        self.ids = {r["run_id"]: time.strftime("%Y%m%d-%H%M%S", time.gmtime(r["launched_at"] + self.shift))
                    + "-%04x" % (i % 0x10000) for r in self.template["runs"] if r.get("launched_at")}
        self.rng = random.Random(i)
        self.seq = 0

    def snapshot(self) -> dict[str, Any]:
        """The next snapshot (without `type`), as the real agent's `snapshot()` builds it."""
        t = self.template
        self.seq += 1
        r = self.rng
        host = dict(t["host"], hostname=self.hostname)
        host["load"] = [round(max(0.0, x * r.uniform(0.8, 1.2)), 2) for x in host.get("load") or [0, 0, 0]]
        host["uptime"] = round(float(host.get("uptime") or 0) + self.shift, 2)
        gpus = []
        for g in t["gpus"]:
            g = dict(g)
            busy = bool(g.get("processes"))
            if isinstance(g.get("util"), int) and busy:
                g["util"] = max(0, min(100, g["util"] + r.randint(-3, 3)))
            if isinstance(g.get("mem_used"), int) and busy:
                g["mem_used"] = max(0, g["mem_used"] + r.randint(-64, 64) * 2**20)
            if isinstance(g.get("temp"), int):
                g["temp"] = g["temp"] + r.randint(-1, 1)
            if isinstance(g.get("power"), (int, float)):
                g["power"] = round(g["power"] * r.uniform(0.97, 1.03), 2)
            gpus.append(g)
        runs = [self._moved(run) for run in t["runs"]]
        procs = []
        for p in t["processes"]:
            p = dict(p, run_id=self.ids.get(p["run_id"], p["run_id"])) if p.get("run_id") else dict(p)
            if isinstance(p.get("cpu"), (int, float)):
                p["cpu"] = round(p["cpu"] * r.uniform(0.9, 1.1), 1)
            procs.append(p)
        return {"seq": self.seq, "time": time.time(), "host": host, "gpu_source": t["gpu_source"],
                "gpu_error": t["gpu_error"], "gpus": gpus, "processes": procs, "runs": runs}

    def _moved(self, run: dict[str, Any]) -> dict[str, Any]:
        run = dict(run, run_id=self.ids.get(run["run_id"], run["run_id"]))
        for key in ("launched_at", "ended_at", "started_at"):
            if isinstance(run.get(key), (int, float)):
                run[key] = run[key] + self.shift
        return run

    def runs(self) -> list[dict[str, Any]]:
        return [self._moved(run) for run in self.template["runs"]]


# ---------------------------------------------------------------------- the agent protocol


class BadRequest(Exception):
    pass


class FakeAgent:
    """The agent's side of one session: request lines in, result/snapshot/log lines out."""

    def __init__(self, data: HostData, write: Any) -> None:
        self.data = data
        self.write = write  # bytes -> None
        self.interval = 1.0
        self.configured = False
        self.subs: dict[str, str] = {}
        self._wake = asyncio.Event()

    def emit(self, msg: dict[str, Any]) -> None:
        self.write((json.dumps(msg, separators=(",", ":")) + "\n").encode())

    def hello(self) -> None:
        self.emit(dict(self.data.hello, time=time.time(), patch_recovered=[]))

    async def ticker(self) -> None:
        """A snapshot every `interval` once configured (the agent's main loop)."""
        while True:
            if not self.configured:
                await self._wake.wait()
                self._wake.clear()
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
                self._wake.clear()  # configured again: the clock restarts
            except asyncio.TimeoutError:
                self.emit(dict(type="snapshot", **self.data.snapshot()))

    def handle(self, line: bytes) -> None:
        try:
            req = json.loads(line)
        except ValueError:
            text = line[:60].decode("utf-8", "replace").strip()
            self.emit({"type": "error", "message": "request is not JSON: %r" % text})
            return
        rid = req.get("id") if isinstance(req, dict) else None
        if not isinstance(rid, int) or isinstance(rid, bool):
            self.emit({"type": "error", "message": "request lacks an integer id"})
            return
        op, args = req.get("op"), req.get("args") or {}
        fn = getattr(self, "op_" + str(op), None)
        if fn is None or not isinstance(args, dict):
            self.emit({"type": "result", "id": rid, "ok": False,
                       "error": "unknown op %r (not replayed by the fake host)" % op})
            return
        try:
            result = fn(args)
        except BadRequest as exc:
            self.emit({"type": "result", "id": rid, "ok": False, "error": str(exc)})
            return
        after = None
        if isinstance(result, tuple):
            result, after = result
        self.emit({"type": "result", "id": rid, "ok": True, "result": result})
        if after is not None:
            after()

    def op_configure(self, args: dict[str, Any]) -> Any:
        interval = args.get("interval", self.interval)
        if not isinstance(interval, (int, float)) or not 0.05 <= interval <= 3600:
            raise BadRequest("interval must be between 0.05 and 3600 s")
        self.interval = float(interval)
        self.configured = True
        self._wake.set()
        return {}, lambda: self.emit(dict(type="snapshot", **self.data.snapshot()))

    def op_snapshot(self, args: dict[str, Any]) -> Any:
        return self.data.snapshot()

    def op_runs(self, args: dict[str, Any]) -> Any:
        return {"runs": self.data.runs(), "warnings": []}

    def op_outcomes(self, args: dict[str, Any]) -> Any:
        return {"outcomes": {str(a): None for a in args.get("ids") or []}}

    def op_subscribe(self, args: dict[str, Any]) -> Any:
        name, path, offset = args.get("sub"), args.get("path"), args.get("offset") or 0
        if not isinstance(name, str) or not isinstance(path, str):
            raise BadRequest("missing argument 'sub'" if not isinstance(name, str) else "missing argument 'path'")
        self.subs[name] = path
        data = self.data.files.get(path)
        if data is None:
            return ({"inode": None, "size": None, "offset": 0},
                    lambda: self.emit({"type": "log_reset", "sub": name, "path": path, "reason": "missing",
                                       "inode": None, "offset": 0}))
        inode, size = self.data.inodes[path], len(data)
        if offset < 0:  # the tail: from the first line break after size + offset
            pos = size + offset
            if pos <= 0:
                offset = 0
            else:
                cut = data[pos - 1:pos - 1 + 65536].find(b"\n")
                offset = pos + cut if cut >= 0 else pos

        def send() -> None:
            at = offset
            while at < size:
                chunk = data[at:at + CHUNK]
                self.emit({"type": "log", "sub": name, "path": path, "inode": inode, "offset": at,
                           "b64": base64.b64encode(chunk).decode("ascii")})
                at += len(chunk)
        return {"inode": inode, "size": size, "offset": offset}, send

    def op_unsubscribe(self, args: dict[str, Any]) -> Any:
        self.subs.pop(str(args.get("sub")), None)
        return {}

    def op_read_range(self, args: dict[str, Any]) -> Any:
        path, offset, length = args.get("path"), args.get("offset"), args.get("length")
        if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 \
                or not 0 <= length <= READ_RANGE_MAX:
            raise BadRequest("read_range needs offset >= 0 and 0 <= length <= 4 MiB")
        data = self.data.files.get(str(path))
        if data is None:
            raise BadRequest("%s does not exist" % path)
        return {"offset": offset, "b64": base64.b64encode(data[offset:offset + length]).decode("ascii"),
                "size": len(data), "inode": self.data.inodes[str(path)]}

    def op_file_read(self, args: dict[str, Any]) -> Any:
        import hashlib

        data = self.data.files.get(str(args.get("path")))
        if data is None:
            return {"exists": False, "sha256": None, "size": None, "mode": None, "b64": None}
        return {"exists": True, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                "mode": 0o644, "b64": base64.b64encode(data).decode("ascii")}


# ---------------------------------------------------------------------- the SSH side


RDIR = re.compile(r"[\w.~/-]*agent-[0-9a-f]{12}")


async def session(data: HostData, home: Path, process: Any) -> None:
    """One exec channel: the start command, the trust check, or the start after upload."""
    from tui.transport import hostpython

    cmd = process.command or ""
    python = f"python3\t{data.hello['python']} /usr/bin/python3\n"
    try:
        if hostpython.STARTED in cmd:
            m = RDIR.search(cmd)
            if not m or not (home / m.group(0) / ".complete").is_file():
                process.stdout.write((python + hostpython.PROBED + "\n").encode())
                process.exit(0)
                return
            process.stdout.write((python + hostpython.STARTED + "\n").encode())
        elif "agent/main.py" in cmd and "exec " in cmd:
            pass  # the start after an upload: the agent's output is all there is
        elif hostpython.UNTRUSTED in cmd:
            process.stdout.write(b"ok\n")
            process.exit(0)
            return
        else:
            process.stderr.write(b"fake host: this command is not replayed\n")
            process.exit(127)
            return
        agent = FakeAgent(data, process.stdout.write)
        agent.hello()
        ticker = asyncio.ensure_future(agent.ticker())
        try:
            while True:
                line = await process.stdin.readline()
                if not line:
                    break
                if line.strip():
                    agent.handle(line)
        finally:
            ticker.cancel()
        process.exit(0)
    except (OSError, ConnectionError):
        pass
    except Exception as exc:  # noqa: BLE001 - the channel ends, the server lives on
        if not process.is_closing():
            process.stderr.write(f"fake host: {type(exc).__name__}: {exc}\n".encode())
            process.exit(1)


def write_keys(out: Path) -> tuple[Any, Any]:
    import asyncssh

    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key.write_private_key(str(out / "client_key"))
    os.chmod(out / "client_key", 0o600)
    return host_key, client_key


async def start(n: int, out: Path, fixture: dict[str, Any], shapes: list[str] | None = None) -> list[Any]:
    """N fake hosts listening (host i on `shapes[i]`, else the i-th shape in turn); DIR
    gets the client key, known_hosts, ssh_config and hosts files. Returns the servers."""
    import asyncssh

    out.mkdir(parents=True, exist_ok=True)
    home = out / "home"
    home.mkdir(exist_ok=True)
    host_key, client_key = write_keys(out)
    authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
    host_pub = host_key.export_public_key().decode().split()
    servers, known, names = [], [], []
    for i in range(n):
        data = HostData(fixture, i, shapes[i] if shapes else None)

        def factory(process: Any, data: HostData = data) -> Any:
            return session(data, home, process)

        server = await asyncssh.listen(
            "127.0.0.1", 0, server_host_keys=[host_key], authorized_client_keys=authorized,
            process_factory=factory, encoding=None, allow_scp=False, x509_trusted_certs=None,
            sftp_factory=lambda chan: asyncssh.SFTPServer(chan, chroot=str(home).encode()))
        port = server.sockets[0].getsockname()[1]
        servers.append(server)
        names.append(f"f{i:03d}@127.0.0.1:{port}")
        known.append(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (out / "known_hosts").write_text("".join(known))
    (out / "ssh_config").write_text(
        f"Host 127.0.0.1\n    IdentityFile {out / 'client_key'}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {out / 'known_hosts'}\n    StrictHostKeyChecking yes\n    BatchMode yes\n")
    (out / "hosts").write_text("".join(f"{h}\n" for h in names))
    return servers


async def serve(n: int, out: Path, fixture: dict[str, Any], watch_stdin: bool = False) -> None:
    servers = await start(n, out, fixture)
    print(f"ready {n}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if watch_stdin:  # the bench's pipe: its end (the bench gone) ends the servers too
        import threading

        threading.Thread(target=lambda: (sys.stdin.buffer.read(), loop.call_soon_threadsafe(stop.set)),
                         daemon=True).start()
    await stop.wait()
    for s in servers:
        s.close()


# ---------------------------------------------------------------------- recording


SMI = """#!{python}
# A stand-in nvidia-smi: 8 H200 cards in the format the real one prints (tests/test_agent.py's
# recorded line), busy ones held by the pids in {state}.
import json, sys
state = json.load(open({state!r}))
arg = sys.argv[1]
for i in range(8):
    pid = state.get(str(i))
    uuid = "GPU-75dc73da-78d6-3405-d610-419a0819d2%02d" % i
    if arg.startswith("--query-gpu="):
        used, util, power = (71234 + 97 * i, 96 + i % 4, 612.5 + 3 * i) if pid else (2575, 0, 87.86 + i)
        print("%d, NVIDIA H200, %s, %d, 143771, %d, %d, %.2f, 700.00" % \
(i, uuid, used, util, 35 + i + (20 if pid else 0), power))
    elif arg.startswith("--query-compute-apps=") and pid:
        print("%s, %d, %d" % (uuid, pid, 71000 + 97 * i))
"""

TRAIN = r"""
import sys, time
for step in range(1, 41):
    print("{'loss': %.4f, 'grad_norm': 1.2, 'learning_rate': 1e-4, 'epoch': 0.%02d}" % (2.5 - step / 40, step), flush=True)
    print("%3d%%|###       | %d/400 [00:%02d<05:00,  1.31it/s]" % (step // 4, step, step), flush=True)
time.sleep(600)
"""  # noqa: E501 (a raw string: the job's long print line cannot split without changing its text)

FAIL = r"""
print("Loading checkpoint shards: 100%|##########| 4/4 [00:02<00:00,  1.71it/s]", flush=True)
def forward():
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 139.81 GiB total capacity)")
forward()
"""


def record(out: Path) -> None:
    """Snapshots of four shapes from the real agent, with the logs their runs point at."""
    import tempfile

    from tests.agent_driver import AgentProc

    tmp = Path(tempfile.mkdtemp(prefix="eagle3-fleet-rec-"))
    (tmp / "bin").mkdir()
    state = tmp / "smi.json"
    state.write_text("{}")
    smi = tmp / "bin" / "nvidia-smi"
    smi.write_text(SMI.format(python=sys.executable, state=str(state)))
    smi.chmod(0o755)
    env = {"EAGLE3_TUI_GPU_SOURCE": "nvidia-smi", "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}"}
    shapes: dict[str, Any] = {}
    logs: list[str] = []
    with AgentProc(env=env) as agent:
        hello = {k: v for k, v in agent.hello.items() if k != "patch_recovered"}

        def snap(name: str, runs_dir: Path, wait: Any = lambda s: True) -> dict[str, Any]:
            agent.call("configure", {"interval": 5.0, "runs_dir": str(runs_dir)})
            deadline = time.monotonic() + 20
            while True:
                s = agent.call("snapshot")
                if wait(s) or time.monotonic() > deadline:
                    shapes[name] = s
                    return s
                time.sleep(0.3)

        snap("idle", tmp / "runs-idle")
        agent.call("configure", {"runs_dir": str(tmp / "runs-failed")})
        rec = agent.call("launch", {"name": "run", "argv": [sys.executable, "-c", FAIL],
                                    "cwd": str(tmp), "env": {}, "log": None})
        logs.append(rec["log"])
        snap("failed", tmp / "runs-failed", lambda s: all(r["state"] != "running" for r in s["runs"]))
        agent.call("configure", {"runs_dir": str(tmp / "runs-train")})
        rec = agent.call("launch", {"name": "run", "argv": [sys.executable, "-c", TRAIN],
                                    "cwd": str(tmp), "env": {}, "log": None})
        logs.append(rec["log"])
        state.write_text(json.dumps({str(i): rec["pid"] for i in range(8)}))
        time.sleep(1.5)
        snap("training", tmp / "runs-train", lambda s: any(p["pid"] == rec["pid"] for p in s["processes"]))
        state.write_text(json.dumps({str(i): rec["pid"] for i in range(4)}))
        snap("half", tmp / "runs-train")
        agent.call("kill", {"run_id": rec["run_id"], "graces": [1, 1], "gpu_wait": 0}, timeout=30)
    files = {p: base64.b64encode(Path(p).read_bytes()).decode() for p in logs}
    doc = {"recorded": "tests/fleet_fake.py record: the real agent (remote/agent/main.py) on this machine "
                       "with a stand-in nvidia-smi of 8 H200 cards",
           "hello": hello, "shapes": shapes, "files": files}
    text = json.dumps(doc, indent=1, sort_keys=True).replace(str(tmp), "/home/eagle")
    text = text.replace(os.path.expanduser("~"), "/home/eagle").replace(sys.executable, "/usr/bin/python3")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(f"recorded {sorted(shapes)} into {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--hosts", type=int, required=True)
    s.add_argument("--dir", type=Path, required=True)
    s.add_argument("--fixture", type=Path, default=FIXTURE)
    s.add_argument("--stdin-eof-stops", action="store_true", help="stop when stdin ends (the bench's pipe)")
    r = sub.add_parser("record")
    r.add_argument("--out", type=Path, default=FIXTURE)
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.out)
    else:
        asyncio.run(serve(args.hosts, args.dir, load_fixture(args.fixture), args.stdin_eof_stops))


if __name__ == "__main__":
    main()
