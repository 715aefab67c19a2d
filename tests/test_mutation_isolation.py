"""bench/mutation.py runs mutants only inside a PID namespace of their own.

A mutant of the kill code (say, a run marker compared with `!=`) signals every process
the user can see; as root on a shared machine that is everyone's work. So the mutation
bench re-runs itself under `unshare --pid --fork --mount-proc --kill-child` and refuses,
in one line, where it cannot. These drive its real `isolate()` in a child Python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import os, sys
sys.path.insert(0, {bench!r})
import mutation
status = mutation.isolate()
if status is None:
    print("inside", os.getpid(), sum(name.isdigit() for name in os.listdir("/proc")), flush=True)
    sys.exit(0)
sys.exit(status)
"""


def probe(tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(bench=str(ROOT / "bench")))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          env=env, check=False)


def test_the_bench_runs_in_its_own_pid_namespace_or_not_at_all(tmp_path: Path) -> None:
    """Where a namespace can be made (root, or a user namespace for a normal user), the
    code after `isolate()` runs as pid 1 and sees only its own processes in /proc; where
    it cannot, nothing runs and the reason is one line."""
    done = probe(tmp_path)
    if done.returncode == 2:  # no namespace for this user here: refused, never run outside
        assert "inside" not in done.stdout
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "refusing to run mutants" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    word, pid, seen = done.stdout.split()
    assert (word, pid) == ("inside", "1"), done.stdout
    assert int(seen) <= 2, f"/proc shows {seen} processes: not a fresh PID namespace"


def test_without_unshare_it_refuses_in_one_line_and_runs_nothing(tmp_path: Path) -> None:
    """A host whose unshare fails (no user namespaces, a container without the right)
    gets one line naming why and exit status 2; the mutants never start."""
    fake = tmp_path / "bin"
    fake.mkdir()
    unshare = fake / "unshare"
    unshare.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    unshare.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ.get('PATH', '')}")
    env.pop("EAGLE3_MUTATION_PIDNS", None)
    done = probe(tmp_path, env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "inside" not in done.stdout
    line, = done.stderr.strip().splitlines()
    assert "cannot make a PID namespace (unshare: unshare failed: Operation not permitted)" in line, line
