"""A real single-node Slurm cluster for the tests, in a temp dir, torn down after.

`Cluster(tmp)` starts its own munged (own key, socket, pid, log and seed files) and
slurmctld + slurmd on 127.0.0.1 with free ports, as the current user (SlurmUser and
SlurmdUser are whoever runs the tests), with a faked GRES of two GPUs (`Count=` in
gres.conf: no device files). Commands talk to it through `SLURM_CONF` (`cluster.env`).
Accounting is off (no slurmdbd), so `sacct` fails here and the code falls back;
`Cluster(tmp, accounting=True)` adds Slurm's accounting: its own MariaDB server (a
data dir in the temp dir, on 127.0.0.1 and a socket there) and slurmdbd on 127.0.0.1,
the cluster, an account and the user registered with sacctmgr, and a MinJobAge of a
few seconds so squeue forgets ended jobs and sacct is the only record
(`ACCOUNTING_PACKAGES`: Debian's slurmdbd and mariadb-server).

The node's GPU, a stand-in: `NODE_SMI`, an `nvidia-smi` on PATH only inside jobs (Slurm's
TaskProlog puts its directory first on every task's PATH, as a GPU node has the real one
and a login node none). Its GPU's name carries the job and step ids it ran under, so a
reading that came through `srun --overlap` says so; processes started with HOLDS_GPU=1
in their environment hold 1 GiB on it while they live (read from /proc).

`missing()` names the Debian packages that are not installed ("" when all are): the
tier fails with that line rather than skipping.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODE_SMI = """#!{python}
import os, sys
arg = sys.argv[1]
job = os.environ.get("SLURM_JOB_ID")  # inside a job: the name says which job and step read it
node = os.environ.get("SLURMD_NODENAME", "").encode()  # a node lists its own processes only
if arg.startswith("--query-gpu="):
    print("0, Stand-in GPU%s, GPU-node-0, 0, 81920, 0, 30, 50.0, 700.0"
          % (" job %s step %s" % (job, os.environ.get("SLURM_STEP_ID")) if job else ""))
elif arg.startswith("--query-compute-apps="):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = open("/proc/%s/environ" % pid, "rb").read().split(b"\\0")
            state = open("/proc/%s/stat" % pid, "rb").read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):  # gone meanwhile
            continue
        mine = not node or b"SLURMD_NODENAME=" + node in env  # (every node here shares one kernel)
        if b"HOLDS_GPU=1" in env and mine and state not in (b"Z", b"X"):
            print("GPU-node-0, %s, 1024" % pid)
"""
LINES: list[str] = []  # the tier's story; tests/conftest.py moves it into the test reports and prints it
PACKAGES = {"slurm-wlm": ("slurmctld", "slurmd", "sbatch", "squeue", "scancel"), "munge": ("munged",)}
ACCOUNTING_PACKAGES = {"slurmdbd": ("slurmdbd", "sacct", "sacctmgr"),
                       "mariadb-server": ("mariadbd", "mariadb-install-db", "mariadb")}
SBIN = ("/usr/sbin", "/usr/bin", "/sbin")


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (os.path.join(d, name) for d in SBIN if os.access(os.path.join(d, name), os.X_OK)), None)


def missing(accounting: bool = False) -> str:
    """'' when every program is installed, else one line saying what to install."""
    packages = dict(PACKAGES, **(ACCOUNTING_PACKAGES if accounting else {}))
    need = [pkg for pkg, progs in packages.items() if not all(_which(p) for p in progs)]
    if not need:
        return ""
    return ("the Slurm tier needs the Debian packages %s: sudo apt-get install %s (tests/run "
            "installs them when run as root)" % (", ".join(need), " ".join(need)))


def _die_with_parent() -> None:
    """In the daemon, before exec: SIGTERM when the test process dies, even by SIGKILL,
    so no cluster outlives its tests."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


CONF = """\
ClusterName=e3test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=600
KillWait=3
InactiveLimit=0
GresTypes=gpu
TaskProlog={d}/taskprolog
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class ClusterError(RuntimeError):
    pass


class Cluster:
    """slurmctld + slurmd + munged in `tmp`; use as a context manager."""

    def __init__(self, tmp: Path, accounting: bool = False, nodes: int = 1) -> None:
        self.dir = Path(tmp)
        self.accounting = accounting
        # One slurmd per node, all on this machine (Debian's slurmd takes `-N name` with
        # its own port, spool, pid and log file each): e3node, or e3node1..e3nodeN.
        self.nodes = ["e3node"] if nodes == 1 else ["e3node%d" % (i + 1) for i in range(nodes)]
        self.node = self.nodes[0]
        self.procs: list[subprocess.Popen] = []
        self.conf = self.dir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen:
        out = open(self.dir / "log" / (name + ".out"), "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=self.env, start_new_session=True, preexec_fn=_die_with_parent)
        out.close()
        self.procs.append(p)
        return p

    def log_tail(self) -> str:
        parts = []
        for f in sorted((self.dir / "log").glob("*")):
            lines = f.read_text(errors="replace").splitlines()[-6:]
            parts.append("== %s\n%s" % (f.name, "\n".join(lines)))
        return "\n".join(parts)

    def start(self) -> Cluster:
        why = missing(self.accounting)
        if why:
            raise ClusterError(why)
        d = self.dir
        for sub in ("log", "state", "spool"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        d.chmod(0o755)
        munged = [_which("munged"), "--socket", str(d / "munge.sock"), "--key-file", str(key),
                  "--pid-file", str(d / "munged.pid"), "--log-file", str(d / "log" / "munged.log"),
                  "--seed-file", str(d / "munge.seed"), "--force", "--foreground"]
        self._spawn([a for a in munged if a], "munged")
        self._wait(lambda: (d / "munge.sock").exists(), 10, "munged's socket")
        nodebin = d / "nodebin"  # the node's nvidia-smi: on PATH inside jobs only
        nodebin.mkdir(exist_ok=True)
        (nodebin / "nvidia-smi").write_text(NODE_SMI.format(python=sys.executable))
        (nodebin / "nvidia-smi").chmod(0o755)
        (d / "taskprolog").write_text('#!/bin/sh\necho "export PATH=%s:$PATH"\n' % nodebin)
        (d / "taskprolog").chmod(0o755)
        ctld_port, d_port = _free_ports(2)
        conf = CONF.format(node=self.node, ctld_port=ctld_port, d_port=d_port, user=getpass.getuser(),
                           d=d, host=socket.gethostname().split(".")[0], cpus=os.cpu_count() or 1)
        if self.accounting:
            dbd_port = self._accounting()
            conf = conf.replace("AccountingStorageType=accounting_storage/none\n",
                                "AccountingStorageType=accounting_storage/slurmdbd\n"
                                "AccountingStorageHost=127.0.0.1\nAccountingStoragePort=%d\n"
                                # the munge socket for slurmdbd connections (slurm.conf(5))
                                "AccountingStoragePass=%s/munge.sock\n" % (dbd_port, d))
            conf = conf.replace("MinJobAge=600", "MinJobAge=5")
        if len(self.nodes) > 1:
            one = "NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:2 State=UNKNOWN\n".format(
                node=self.node, cpus=os.cpu_count() or 1)
            lines = "".join(one.replace("NodeName=%s " % self.node, "NodeName=%s Port=%d " % (n, port))
                            for n, port in zip(self.nodes, _free_ports(len(self.nodes))))
            conf = (conf.replace(one, lines).replace("Nodes=%s " % self.node, "Nodes=%s " % ",".join(self.nodes))
                    .replace("%s/spool\n" % d, "%s/spool/%%n\n" % d)
                    .replace("%s/slurmd.pid" % d, "%s/slurmd.%%n.pid" % d)
                    .replace("%s/log/slurmd.log" % d, "%s/log/slurmd.%%n.log" % d))
            for n in self.nodes:
                (d / "spool" / n).mkdir(exist_ok=True)
        self.conf.write_text(conf)
        if self.accounting:
            self._register()
        # Two fake GPUs: gres/gpu wants one device file per GPU (Count= alone registers 0).
        (d / "gres.conf").write_text("".join("NodeName=%s Name=gpu File=%s\n" % (n, dev) for n in self.nodes
                                             for dev in ("/dev/null", "/dev/zero")))
        self._spawn([_which("slurmctld") or "slurmctld", "-D", "-i", "-f", str(self.conf)], "ctld")
        for n in self.nodes:
            self.start_slurmd(n)
        self._wait(self._idle, 30, "the node to come up idle")
        return self

    def start_slurmd(self, node: str) -> subprocess.Popen:
        """The node's slurmd (again, after `stop_slurmd`: it finds its running steps)."""
        return self._spawn([_which("slurmd") or "slurmd", "-D", "-N", node, "-f", str(self.conf)],
                           "d" if node == self.node else "d-" + node)

    def stop_slurmd(self, node: str) -> None:
        """Stop one node's slurmd, as a node that stops answering: its jobs' processes
        (under slurmstepd) go on, and a new step there cannot start."""
        p = next(p for p in self.procs if p.poll() is None and p.args[-3] == node)
        p.terminate()
        p.wait(timeout=15)
        self.procs.remove(p)

    def _accounting(self) -> int:
        """MariaDB and slurmdbd, before slurmctld; the port slurmdbd listens on."""
        d, user = self.dir, getpass.getuser()
        db_port, dbd_port = _free_ports(2)
        sock = d / "mysql.sock"
        init = subprocess.run([_which("mariadb-install-db") or "mariadb-install-db", "--no-defaults",
                               "--datadir=%s" % (d / "db"), "--user=%s" % user, "--skip-test-db",
                               "--auth-root-authentication-method=socket"],
                              env=self.env, capture_output=True, text=True, timeout=120)
        if init.returncode != 0:
            raise ClusterError("mariadb-install-db failed: %s" % (init.stderr or init.stdout)[-500:])
        self._spawn([_which("mariadbd") or "mariadbd", "--no-defaults", "--datadir=%s" % (d / "db"),
                     "--socket=%s" % sock, "--port=%d" % db_port, "--bind-address=127.0.0.1",
                     "--user=%s" % user, "--pid-file=%s" % (d / "mariadb.pid"),
                     "--log-error=%s" % (d / "log" / "mariadb.log")], "mariadbd")
        self._wait(sock.exists, 60, "MariaDB's socket")
        sql = ("CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'e3test';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        self._wait(lambda: subprocess.run([_which("mariadb") or "mariadb", "--no-defaults", "-S", str(sock),
                                           "-u", user, "-e", sql], capture_output=True, timeout=30,
                                          env=self.env).returncode == 0, 60, "MariaDB to take the user")
        dbd_conf = d / "slurmdbd.conf"  # beside slurm.conf, where slurmdbd looks (SLURM_CONF)
        dbd_conf.write_text(
            "AuthType=auth/munge\nAuthInfo=socket=%s/munge.sock\nDbdAddr=127.0.0.1\nDbdHost=localhost\n"
            "DbdPort=%d\nSlurmUser=%s\nStorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
            "StoragePort=%d\nStorageUser=slurm\nStoragePass=e3test\nStorageLoc=slurm_acct_db\n"
            "PidFile=%s/slurmdbd.pid\nLogFile=%s/log/slurmdbd.log\n" % (d, dbd_port, user, db_port, d, d))
        dbd_conf.chmod(0o600)
        self._spawn([_which("slurmdbd") or "slurmdbd", "-D"], "slurmdbd")
        return dbd_port

    def _register(self) -> None:
        """The cluster, an account and this user in slurmdbd (sacctmgr), before slurmctld."""
        user = getpass.getuser()
        for args in (["add", "cluster", "e3test"], ["add", "account", "e3", "cluster=e3test"],
                     ["add", "user", user, "account=e3", "cluster=e3test"]):
            def done(args: list[str] = args) -> bool:
                r = subprocess.run([_which("sacctmgr") or "sacctmgr", "-i", *args], env=self.env,
                                   capture_output=True, text=True, timeout=30)
                return r.returncode == 0 or "already exist" in (r.stdout + r.stderr).lower()
            self._wait(done, 60, "sacctmgr " + " ".join(args))

    def _idle(self) -> bool:
        for p in self.procs:
            if p.poll() is not None:
                raise ClusterError("%r exited with %s\n%s" % (p.args, p.returncode, self.log_tail()))
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env, capture_output=True,
                           text=True, timeout=10)
        return r.returncode == 0 and r.stdout.split() == ["idle"] * len(self.nodes)

    def _wait(self, cond, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if cond():
                return
            time.sleep(0.2)
        raise ClusterError("timed out waiting for %s\n%s" % (what, self.log_tail()))

    def stop(self) -> None:
        if self.procs and all(p.poll() is None for p in self.procs):
            try:  # jobs first, so slurmd's steps do not outlive the cluster
                subprocess.run(["scancel", "--full", "--user", getpass.getuser()], env=self.env,
                               capture_output=True, timeout=10, check=False)
            except subprocess.TimeoutExpired:
                pass
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        self.procs.clear()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
