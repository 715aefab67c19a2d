"""The agent inside a Slurm job, on one of its nodes: ``PYTHON -u step.py RUN_ID``,
started by the login node's agent through ``srun --overlap`` or ssh (node.py, the
follower). It is main.py's agent with no runner: it samples and answers, runs nothing, and
ends after the snapshot that proves the run's processes gone and its GPUs free (the
kill's proof). Its own module, so that the follower (which main.py imports) and the
agent do not import each other. Standard library only; Python 3.9+.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Dict, List, Set

if not __package__:  # started as a file: docs/architecture.md, "Upload layout and imports"
    _HERE = os.path.dirname(os.path.abspath(__file__))  # off sys.path, for the dir above
    _ABOVE = os.path.dirname(os.path.dirname(_HERE))
    sys.path[:] = [_ABOVE] + [p for p in sys.path if os.path.abspath(p) != _HERE]

from remote.agent import main as agent
from remote.base import wire

END_S = 120.0  # seconds a node agent may outlive Slurm's SIGTERM, waiting for the proof


def step_env() -> Dict[str, Any]:
    """Where a job step's agent runs, as Slurm's environment says (in its hello)."""
    return {"job_id": os.environ.get("SLURM_JOB_ID"), "step_id": os.environ.get("SLURM_STEP_ID"),
            "node": os.environ.get("SLURMD_NODENAME")}


def main(run_id: str) -> int:
    """The agent inside the job, following ``run_id``. It outlives Slurm's SIGTERM (a
    kill's ``scancel --signal=TERM``, or the job's end) until the processes of the run it
    saw here are gone and hold no GPU memory, then ends after that snapshot: the kill's
    proof. At most END_S; Slurm's SIGKILL after KillWait ends it anyway."""
    pids: Set[int] = set()
    ending: List[float] = []

    class StepAgent(agent.Agent):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(None)
            self.runner = self.killer = self.slurm = self.slurm_killer = None
            self.runner_error = "a job step's agent runs nothing"
            self.read_ok = False  # the latest GPU reading worked

        def hello(self) -> Dict[str, Any]:
            return dict(super().hello(), slurm_step=step_env())

        def snapshot(self) -> Dict[str, Any]:
            snap = super().snapshot()
            pids.update(p["pid"] for p in snap["processes"] if p.get("run_id") == run_id)
            self.read_ok = not snap.get("gpu_error")  # a failed GPU reading is no proof
            return snap

        def send_snapshot(self) -> None:
            super().send_snapshot()
            left = [p for p in self.last_procs or [] if p.get("pid") in pids]  # alive or on a GPU
            if ending and ((not left and self.read_ok) or time.monotonic() - ending[0] > END_S):
                wire.CLIENT_GONE.set()  # that snapshot was the last: the loop winds down

        def on_signal(self, num: int, frame: Any) -> None:
            ending[:] = ending or [time.monotonic()]
            if not self.configured:
                wire.CLIENT_GONE.set()
            self.next_snap = time.monotonic()
            os.write(self.wake_w, b"x")

    step = StepAgent()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, step.on_signal)
    return step.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else 2)
