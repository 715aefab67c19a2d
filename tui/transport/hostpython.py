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

The agent directory is trusted only when it is ours alone (`trust_check`): before the
agent is started (every start) and after an upload, the directory, its parent and
every entry in it must be owned by the login user, writable by no group or other user,
and no symlink; else the start is refused with one line naming the path, its owner and
its mode (`ls -ld`). The two directories, when ours, first lose group/other write
(`chmod go-w`: an older upload under a umask of 002), so that does not lock a user out.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass

from .bundle import AGENT_MAIN
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
UNTRUSTED = "EAGLE3-TUI-UNTRUSTED"  # the agent dir is not ours alone; `ls -ld` of it follows


# The login's umask is kept for the run (the shim restores it); the agent runs under 022.
KEEP_UMASK = 'EAGLE3_TUI_UMASK=$(umask); export EAGLE3_TUI_UMASK; umask 022; '


def trust_check(rdir: str) -> str:
    """Shell: when `rdir`, its parent or anything under `rdir` is a symlink, owned by
    another user, or writable by group or others, print UNTRUSTED and `ls -ld` of the
    first such path, and exit 3. Our own two directories lose group/other write first (an older
    upload under a umask of 002), and the umask becomes 022 (the login's is kept in
    EAGLE3_TUI_UMASK; the shim gives it back to the run), so what the agent and Python
    write there (`__pycache__`, the remembered interpreter) stays ours alone."""
    parent = rdir.rsplit("/", 1)[0] if "/" in rdir else "."
    q, qp = shlex.quote(rdir), shlex.quote(parent)
    bad = r'\( -type l -o ! -user "$u" -o -perm -020 -o -perm -002 \)'
    return (f'{KEEP_UMASK}u=$(id -u); '
            f'for d in {qp} {q}; do [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] '
            f'&& chmod go-w "$d" 2>/dev/null; done; '
            f'b=$({{ find {qp} {q} -prune {bad} -print; '
            f'find {q} -mindepth 1 {bad} -print; }} 2>/dev/null | head -n 1); '
            f'if [ -n "$b" ]; then echo {UNTRUSTED}; ls -ld -- "$b"; exit 3; fi; ')


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
    """One shell line: find the interpreter; exec `rdir/remote/agent/main.py` on it if uploaded.

    Prints `NAME<TAB>VERSION EXECUTABLE` for the remembered interpreter, or for each
    candidate that answered, then either STARTED and the agent's own output, or PROBED.
    """
    agent = shlex.join(["-u", f"{rdir}/{AGENT_MAIN}", *agent_args])
    complete, cache = shlex.quote(rdir + "/.complete"), cache_file(python, rdir)
    remember = _remember(cache, '"$p"', '"$v"')
    script = (
        trust_check(rdir) +
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
    """Start the just-uploaded agent on `found`, remembering it for the next start (the
    client checked the directory with `trust_check` after the upload)."""
    agent = shlex.join([found.path, "-u", f"{rdir}/{AGENT_MAIN}", *agent_args])
    remember = _remember(cache_file(python, rdir), shlex.quote(found.name), shlex.quote(f"{found.dotted} {found.path}"))
    return shlex.join(["sh", "-c", KEEP_UMASK + remember + "exec " + agent])


def untrusted_error(where: str, rdir: str, lines: list[str]) -> str:
    """The one line for a refused agent directory, from what `trust_check` printed."""
    detail = " ".join("".join(c if c.isprintable() else "?" for c in ln) for ln in lines).strip()
    return (f"refusing to run the agent from {where}:{rdir}: {detail or 'a path in it'} is not "
            f"yours alone (owned by another user, writable by group or others, or a symlink)")


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
            found.append(Found(name, version, path))
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
os.makedirs(d, 0o700, exist_ok=True)
for name, (b64, sha) in sorted(files.items()):
    data = base64.b64decode(b64)
    sub, _, base = name.rpartition("/")
    if hashlib.sha256(data).hexdigest() != sha or any(p[:1] in ("", ".") for p in name.split("/")):
        sys.exit("checksum mismatch for " + name)
    os.makedirs(os.path.join(d, sub), 0o700, exist_ok=True)
    tmp = os.path.join(d, sub, ".%s.tmp-%d" % (base, os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(d, name))
fd = os.open(os.path.join(d, ".complete"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
with os.fdopen(fd, "w") as f:
    f.write(sys.argv[2] + "\n")
print("ok %d" % len(files))
"""
