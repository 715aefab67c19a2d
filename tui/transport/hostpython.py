"""Finding a host Python the agent can run on, and the exec-channel upload.

The agent needs Python >= 3.9. One command on the host (`start_command`) asks the
candidates for their versions in order (`[host] python` when set; else `python3`, then
`python3.X` from the newest down to 3.9) until one is new enough, and when the agent of
this content hash is already uploaded, execs it on that interpreter at once: a warm
start is one round trip. The interpreter found is remembered beside the agent
(`.python-<key>`, with the login's PATH), so the next start execs it without asking the
candidates again (a pyenv shim alone costs ~0.3 s per call); a changed PATH, or the
interpreter gone, asks again. Otherwise it prints what it found and the client uploads,
then starts the agent. When no candidate is new enough, the user gets one line naming
what was found and the setting that fixes it.

Hosts without an SFTP subsystem (hardened sshd, dropbear, many containers) get the
agent files over an exec channel instead: `UPLOAD` reads them as JSON on stdin,
writes each atomically and checks its sha256 before the `.complete` marker is written.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass

from .errors import ConfigError

MIN_VERSION = (3, 9)
CANDIDATES = ("python3", *(f"python3.{x}" for x in range(14, 8, -1)))

# Valid in Python 2 and 3, so even a very old interpreter answers with its version.
PROBE = 'import sys; print("%d.%d.%d %s" % (tuple(sys.version_info[:3]) + (sys.executable,)))'


class HostPythonError(ConfigError):
    """No interpreter on the host is new enough for the agent (exit 2: the config fixes it)."""


@dataclass(frozen=True)
class Found:
    name: str  # as asked for: "python3", "python3.11", "/opt/venv/bin/python"
    version: tuple[int, int, int]
    path: str  # sys.executable

    @property
    def dotted(self) -> str:
        return ".".join(map(str, self.version))


# A shell `case` pattern for an answer from a version >= MIN_VERSION (3.9 … 3.99, 4+),
# so the host's shell stops at the first good candidate.
assert MIN_VERSION[0] == 3 and MIN_VERSION[1] < 10
NEW_ENOUGH = f"3.[{MIN_VERSION[1]}-9].*|3.[1-9][0-9].*|[4-9].*"
STARTED = "EAGLE3-TUI-AGENT-STARTS"  # the agent's own output follows this line
PROBED = "EAGLE3-TUI-PROBED"  # the probe ended without starting the agent


def _names(python: str | None) -> str:
    return " ".join(shlex.quote(n) for n in ((python,) if python else CANDIDATES))


def cache_file(python: str | None, rdir: str) -> str:
    """Where the interpreter found for these candidates is remembered on the host."""
    return f"{rdir}/.python-{hashlib.sha256(_names(python).encode()).hexdigest()[:8]}"


def _remember(cache: str, name: str, answer: str) -> str:
    """Shell: write `$PATH` and `NAME<TAB>ANSWER` to `cache` (atomically; no error if it cannot)."""
    tmp = shlex.quote(cache + ".tmp") + "$$"
    return (f'{{ printf "%s\\n" "$PATH"; printf "%s\\t%s\\n" {name} {answer}; }} 2>/dev/null >{tmp} '
            f'&& mv -f {tmp} {shlex.quote(cache)}; ')


def start_command(python: str | None, rdir: str, agent_args: list[str]) -> str:
    """One shell line: find the interpreter; exec `rdir/agent.py` on it if uploaded.

    Prints `NAME<TAB>VERSION EXECUTABLE` for the remembered interpreter, or for each
    candidate that answered, then either STARTED and the agent's own output, or PROBED.
    """
    agent = shlex.join(["-u", f"{rdir}/agent.py", *agent_args])
    complete, cache = shlex.quote(rdir + "/.complete"), cache_file(python, rdir)
    remember = _remember(cache, '"$p"', '"$v"')
    script = (
        f'if [ -f {complete} ] && {{ IFS= read -r c && IFS= read -r l; }} 2>/dev/null <{shlex.quote(cache)} '
        '&& [ "$c" = "$PATH" ] && v=${l#*	} && [ -x "${v#* }" ]; then '
        f'printf "%s\\n" "$l"; echo {STARTED}; exec "${{v#* }}" {agent}; fi; '
        f'for p in {_names(python)}; do '
        f'v=$("$p" -c {shlex.quote(PROBE)} 2>/dev/null) || continue; '
        r'printf "%s\t%s\n" "$p" "$v"; '
        f'case "$v" in {NEW_ENOUGH}) ;; *) continue ;; esac; '
        f'if [ -f {complete} ]; then {remember}'
        f'echo {STARTED}; exec "${{v#* }}" {agent}; fi; '
        f'break; done; echo {PROBED}'
    )
    # Through sh: the login shell may be fish or csh, which read loops differently.
    return shlex.join(["sh", "-c", script])


def start_after_upload(found: Found, python: str | None, rdir: str, agent_args: list[str]) -> str:
    """Start the just-uploaded agent on `found`, remembering it for the next start."""
    agent = shlex.join([found.path, "-u", f"{rdir}/agent.py", *agent_args])
    remember = _remember(cache_file(python, rdir), shlex.quote(found.name), shlex.quote(f"{found.dotted} {found.path}"))
    return shlex.join(["sh", "-c", remember + "exec " + agent])


def parse_probe(output: str, python: str | None) -> list[Found]:
    """Candidates from `start_command`'s lines, or `python`'s bare answer to PROBE."""
    found = []
    for line in output.splitlines():
        name, tab, answer = line.partition("\t")
        if not tab:
            if not python:
                continue  # noise from the login's shell rc
            name, answer = python, line
        dotted, _, path = answer.strip().partition(" ")
        try:
            version = tuple(int(x) for x in dotted.split("."))
        except ValueError:
            continue
        if len(version) == 3 and path:
            found.append(Found(name, version, path))  # type: ignore[arg-type]
    return found


def choose(found: list[Found], python: str | None, where: str) -> Found:
    """The first candidate >= 3.9, or HostPythonError with the one line the user needs."""
    for f in found:
        if f.version[:2] >= MIN_VERSION:
            return f
    need = ".".join(map(str, MIN_VERSION))
    hint = f'(set [host] python = "/path/to/python{need}+")'
    if found:
        f = found[0]
        return _raise(f"host {f.name} is {f.dotted} at {f.path} on {where}; "
                      f"the agent needs ≥ {need} {hint}")
    asked = python or "python3 (nor python3.9 … python3.14)"
    return _raise(f"no {asked} found on {where}; the agent needs Python ≥ {need} {hint}")


def _raise(message: str) -> Found:
    raise HostPythonError(message)


UPLOAD = r"""
import base64, hashlib, json, os, sys
d = sys.argv[1]
files = json.loads(sys.stdin.read())
os.makedirs(d, exist_ok=True)
for name, (b64, sha) in sorted(files.items()):
    data = base64.b64decode(b64)
    if hashlib.sha256(data).hexdigest() != sha or "/" in name:
        sys.exit("checksum mismatch for " + name)
    tmp = os.path.join(d, ".%s.tmp-%d" % (name, os.getpid()))
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(d, name))
with open(os.path.join(d, ".complete"), "w") as f:
    f.write(sys.argv[2] + "\n")
print("ok %d" % len(files))
"""
