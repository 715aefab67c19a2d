"""The run lifecycle API the agent calls, by role: ``rundir`` (run directories and
records: list, prune), ``launch`` (start a run under the shim), ``shim`` (the
supervisor), ``adopt`` (external runs); kill is in the sibling ``kill.py``.
Standard library only; runs on the host's Python 3.9+. See rundir.py for the layout
of a run directory.
"""

from __future__ import annotations

from remote.run.adopt import NO_LOG_NOTE, external_runs, stdout_log
from remote.run.launch import LAUNCH_WAIT, launch
from remote.run.rundir import RUN_ENV, RunnerError, default_runs_dir, list_runs, prune_runs

__all__ = [
    "LAUNCH_WAIT", "NO_LOG_NOTE", "RUN_ENV", "RunnerError", "default_runs_dir",
    "external_runs", "launch", "list_runs", "prune_runs", "stdout_log",
]
