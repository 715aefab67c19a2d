"""Mutation testing of the modules whose bugs cost users most, outside CI.

    nice -n 19 python bench/mutation.py [MODULE ...] [--budget S] [--list]

cosmic-ray (the `mutation` extra) makes one small bug at a time in a module -- on disk, in a
copy of this working tree, never in the tree itself -- and runs only the test files that
claim that module's behaviour (pyproject.toml [tool.eagle3-mutation.modules]). A mutant
the tests let through is a survivor: a bug users could get with a green suite.

cosmic-ray and not mutmut: most of these modules run in a subprocess the tests start (the
host agent runs remote/agent/main.py as a script, the CLI tests start `python -m tui.cli`), and
mutmut 3 switches its mutants inside the test process and counts which tests reach each
function there, so it sees none of the agent's code run. cosmic-ray writes the mutant to
the file, which every subprocess then imports (tests/checkout.py points them at the copy).

The bugs are what a slip of the hand makes (pyproject.toml says which of cosmic-ray's
operators, and why the others are left out): a number off by one, True for False, `and`
for `or`, a comparison negated, off by one or turned around, `not` added or dropped,
`break` for `continue`, a loop never run, an except clause that catches another
exception, a decorator removed.

Each run lives in its own PID namespace (unshare: --pid --fork --mount-proc, as root or a
user namespace's root): a mutant of the kill, the restart or the shim can signal the wrong
processes -- a kill whose marker test is negated takes every process it can see for the run's
and sends SIGINT, SIGTERM, SIGKILL to each -- and there it sees only the mutation run's own.
Without a namespace this script refuses to run (one line), since on a shared machine
such a mutant would end everyone's processes.

Each module runs alone, within its time budget (seconds, --budget or the config's); a
module that runs out reports the mutants done so far and how many were left. Reports go
to stdout and to .mutation/<module>.json (git ignores it).

A module with hundreds of mutants does not fit a budget on a small machine: --sample N
runs a seeded random N of them (--seed; the same N and seed pick the same mutants while
the module's text is unchanged), and the score is the sample's. --survivors re-runs
only the survivors of the module's last report (after new tests were written) and
reports that run's score over the same mutants: the earlier kills stand, since a test
added never lets a killed mutant through.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # 3.10: tomli is the same parser
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["eagle3-mutation"]


def copy_tree(dest: Path) -> None:
    """The working tree's tracked and untracked-not-ignored files (what a commit would see)."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def cr_config(module: str, tests: list[str], cfg: dict) -> str:
    pytest = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    return "\n".join([
        "[cosmic-ray]",
        f"module-path = {json.dumps(module)}",
        f"timeout = {float(cfg['timeout'])}",
        "excluded-modules = []",
        f"test-command = {json.dumps(shlex.join(pytest))}",
        "[cosmic-ray.distributor]",
        'name = "local"',
        "[cosmic-ray.filters.operators-filter]",
        f"exclude-operators = {json.dumps(cfg['exclude-operators'])}",
        "",
    ])


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float | None = None) -> int:
    try:
        return subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, check=False,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    except subprocess.TimeoutExpired:
        return -1


def results(work: Path, env: dict[str, str]) -> list[dict]:
    dump = subprocess.run([str(BIN / "cosmic-ray"), "dump", "session.sqlite"], cwd=work, env=env,
                          capture_output=True, text=True, check=True).stdout
    out = []
    for line in dump.splitlines():
        item, result = json.loads(line)
        (mutation,) = item["mutations"]
        outcome = None
        if result is not None:
            outcome = ("filtered" if result["worker_outcome"] == "skipped"
                       else result["test_outcome"] or result["worker_outcome"])
        out.append({"operator": mutation["operator_name"], "occurrence": mutation["occurrence"],
                    "line": mutation["start_pos"][0], "outcome": outcome,
                    "diff": (result or {}).get("diff") or ""})
    return out


def keep_only(work: Path, env: dict[str, str], keep) -> None:
    """Mark every pending mutant that ``keep(operator, occurrence)`` rejects as not to run."""
    code = """
import sys
from cosmic_ray.work_db import use_db, WorkDB
from cosmic_ray.work_item import WorkResult, WorkerOutcome
keep = set(map(tuple, __import__("json").loads(sys.stdin.read())))
with use_db("session.sqlite", WorkDB.Mode.open) as db:
    drop = [w.job_id for w in db.pending_work_items
            if (w.mutations[0].operator_name, w.mutations[0].occurrence) not in keep]
    db.set_multiple_results(drop, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not chosen"))
"""
    pending = pending_mutants(work, env)
    chosen = [m for m in pending if keep(*m)]
    subprocess.run([sys.executable, "-c", code], cwd=work, env=env, input=json.dumps(chosen),
                   text=True, check=True)


def pending_mutants(work: Path, env: dict[str, str]) -> list[tuple[str, int]]:
    """(operator, occurrence) of every mutant no filter removed, in the session's order."""
    return sorted((r["operator"], r["occurrence"]) for r in results(work, env) if r["outcome"] is None)


def tests_at(rev: str, work: Path) -> None:
    """Replace the copy's tests/ by those of commit ``rev`` (a score before new tests)."""
    shutil.rmtree(work / "tests")
    archive = subprocess.run(["git", "archive", rev, "tests"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)


def mutate(module: str, tests: list[str], cfg: dict, budget: float, rev: str | None = None,
           sample: int | None = None, seed: int = 0, only: set | None = None) -> dict:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eagle3-mutation-") as tmp:
        work = Path(tmp)
        copy_tree(work)
        if rev:
            tests_at(rev, work)
        tests = [t for t in tests if not t.startswith("tests/") or (work / t).is_file()]
        (work / "cr.toml").write_text(cr_config(module, tests, cfg))
        env = dict(os.environ, PYTHONPATH=str(work))
        env.pop("CI", None)
        cr = str(BIN / "cosmic-ray")
        subprocess.run([cr, "init", "cr.toml", "session.sqlite"], cwd=work, env=env, check=True)
        subprocess.run([str(BIN / "cr-filter-operators"), "session.sqlite", "cr.toml"], cwd=work,
                       env=env, check=True)
        subprocess.run([str(BIN / "cr-filter-pragma"), "session.sqlite"], cwd=work, env=env, check=True)
        pending = pending_mutants(work, env)
        if sample is not None:
            chosen = set(random.Random(seed).sample(pending, min(sample, len(pending))))
            keep_only(work, env, lambda op, occ: (op, occ) in chosen)
        if only is not None:
            keep_only(work, env, lambda op, occ: (op, occ) in only)
        base = subprocess.run([cr, "baseline", "cr.toml"], cwd=work, env=env, capture_output=True,
                              text=True, check=False)
        if base.returncode != 0:
            tail = (base.stdout + base.stderr).strip().splitlines()[-3:]
            return {"module": module, "error": f"the tests fail without any mutant: {tail}"}
        left = budget - (time.monotonic() - start)
        run([cr, "exec", "cr.toml", "session.sqlite"], work, env, timeout=max(left, 1))
        items = [r for r in results(work, env) if r["outcome"] != "filtered"]
    done = [r for r in items if r["outcome"] is not None]
    killed = [r for r in done if r["outcome"] != "survived"]
    survived = [r for r in done if r["outcome"] == "survived"]
    return {"module": module, "tests": tests, "all": len(pending), "mutants": len(items), "done": len(done),
            "killed": len(killed), "survived": survived,
            "score": round(100 * len(killed) / len(done), 1) if done else None,
            "seconds": round(time.monotonic() - start)}


ISOLATED = "EAGLE3_MUTATION_PIDNS"


def isolate() -> int | None:
    """Re-run this script in a fresh PID namespace with its own /proc (see the module's
    doc); its exit status, or None when already inside one."""
    if os.environ.get(ISOLATED) == "1" and os.getpid() == 1:
        return None
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    if os.geteuid() != 0:
        argv.append("--map-root-user")
    probe = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        why = " ".join((probe.stderr or "").split())[:200] or "exit %d" % probe.returncode
        print(f"mutation: cannot make a PID namespace ({why}); refusing to run mutants that may "
              "signal every process this user can see", file=sys.stderr)
        return 2
    # Inside, this script is the namespace's first process (unshare forks, then execs it).
    env = dict(os.environ, **{ISOLATED: "1"})
    return subprocess.run([*argv, sys.executable, *sys.argv], env=env, check=False).returncode


def main() -> int:
    if "--list" not in sys.argv[1:] and "-h" not in sys.argv[1:] and "--help" not in sys.argv[1:]:
        status = isolate()
        if status is not None:
            return status
    cfg = config()
    modules: dict[str, list[str]] = cfg["modules"]
    if not (BIN / "cosmic-ray").is_file():
        print(f"mutation: no cosmic-ray beside {sys.executable}: pip install -e '.[test,demo,mutation]' "
              "into the venv whose Python runs this", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("module", nargs="*", help="default: every configured module, in order")
    ap.add_argument("--budget", type=float, default=float(cfg["budget"]),
                    help="seconds per module (default %(default)s)")
    ap.add_argument("--tests-at", metavar="REV", help="use the tests of commit REV (the score before)")
    ap.add_argument("--sample", type=int, metavar="N", help="run a seeded random N of the mutants")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (default %(default)s)")
    ap.add_argument("--survivors", action="store_true",
                    help="re-run only the survivors of the module's last report")
    ap.add_argument("--list", action="store_true", help="print the modules and their tests")
    args = ap.parse_args()
    if args.list:
        for m, t in modules.items():
            print(m, "<-", " ".join(t))
        return 0
    unknown = [m for m in args.module if m not in modules]
    if unknown:
        print(f"mutation: not configured: {' '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    out_dir = ROOT / ".mutation"
    out_dir.mkdir(exist_ok=True)
    for module in args.module or list(modules):
        tag = f"@{args.tests_at}" if args.tests_at else ""
        report = out_dir / (module.replace("/", "_") + tag + ".json")
        only, earlier = None, None
        if args.survivors:
            if not report.is_file():
                print(f"mutation: {module}: no earlier report to take the survivors of", file=sys.stderr)
                return 2
            earlier = json.loads(report.read_text())
            only = {(s["operator"], s["occurrence"]) for s in earlier["survived"]}
            report = report.with_name(report.stem + ".survivors.json")
        r = mutate(module, modules[module], cfg, args.budget, args.tests_at, args.sample, args.seed, only)
        if earlier is not None and "error" not in r:
            killed = earlier["killed"] + r["killed"]
            r["after"] = {"killed": killed, "done": earlier["done"],
                          "score": round(100 * killed / earlier["done"], 1) if earlier["done"] else None}
        report.write_text(json.dumps(r, indent=1))
        if "error" in r:
            print(f"{module}: {r['error']}")
            continue
        if "after" in r:
            a = r["after"]
            print(f"{module} after: {a['score']}% killed ({a['killed']}/{a['done']}: the earlier "
                  f"kills and {r['killed']} of its {r['done']} survivors)")
        chosen = f" of {r['mutants']} chosen from {r['all']}" if r["mutants"] != r["all"] else ""
        print(f"{module}{' with the tests of ' + args.tests_at if args.tests_at else ''}: {r['score']}% killed "
              f"({r['killed']}/{r['done']} run{chosen}, "
              f"{r['mutants'] - r['done']} not run in the budget) in {r['seconds']} s")
        for s in r["survived"]:
            change = [ln for ln in s["diff"].splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
            print(f"  survived line {s['line']} {s['operator']}: {' | '.join(change)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
