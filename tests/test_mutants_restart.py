"""The host's restart decision reads a log the way the client does (issue 41's sample of
remote/restartpolicy.py): what the user stopped and what a logger marks as a mere
warning are no failure to restart for, on either side, in every prefix shape."""

from __future__ import annotations

import pytest

from remote.restartpolicy import Matcher, decide
from tests.test_restart import OOM, POLICY, WATCHDOG, _both

# One quiet-level line in each prefix shape a launcher or logger puts before the text.
QUIET_SHAPES = [
    "2025-03-21 02:07:08,408 - trainer - WARNING - {}",  # Python logging's " - name - LEVEL - "
    "2025-03-21 02:07:08,408 - trainer - INFO - {}",
    "[warning] {}",  # a bracketed level
    "[W106 12:41:43.88 ProcessGroupNCCL.cpp:1553] {}",  # glog
    "WARNING 12 [trainer.py:88] {}",  # a level before [file:line]
]


@pytest.mark.parametrize("shape", QUIET_SHAPES)
def test_a_failure_quoted_at_a_quiet_level_is_no_cause_on_either_side(shape: str) -> None:
    """A warning that quotes an OOM (a retry, a fallback that worked) is not why a run
    died: with nothing else in the log neither side names a cause, and a real failure
    after it is the cause on both."""
    line = shape.format(OOM)
    assert _both([line]) == (None, None), line
    assert _both([line, WATCHDOG]) == ("nccl-timeout", "nccl-timeout"), line


def test_what_dies_after_the_users_interrupt_is_not_restarted() -> None:
    """Ctrl-C (or a SIGINT the user sent) ends a run with a KeyboardInterrupt, and the
    ranks it leaves behind then fail on their own (an OOM, a watchdog): that is no
    failure to restart for. A failure *before* the interrupt is still the cause."""
    after = ["Traceback (most recent call last):", "KeyboardInterrupt", OOM]
    assert _both(after) == (None, None)
    cause = Matcher(POLICY).root_cause(after)
    assert decide(POLICY, [], {"exit_code": 130, "cause": cause, "ended_at": 0.0}, 0.0)[0] is False
    assert _both([WATCHDOG, "KeyboardInterrupt", OOM]) == ("nccl-timeout", "nccl-timeout")
