"""The restart policy a launch hands to the host's supervisor (remote/run/restart.py, which
applies it with remote/run/restartpolicy.py).

``compile_policy(cfg)`` turns ``[run] restart …`` and ``[watch] on_hang``, ``on_diverge``,
``on_idle`` and ``idle_s`` into one JSON
object: the numbers, and the failure classification the client itself uses — every
signature of the one table (``tui/data/signatures.toml`` plus the user's file) with its
regexes and its ``restart`` class, in the order the client tries them, and the line
prefixes, quiet levels, exception shape, interrupt lines and retry notes of the
client's log analysis. The host compiles the same regexes with Python's ``re``, so a line means the
same there as here (``tests/test_restart.py`` checks both agree on every signature).
"""

from __future__ import annotations

from typing import Any

from tui.protocol import hosttext
from tui.services.config import Config
from tui.state.loganalysis import failures, lineshapes
from tui.state.loganalysis.record import QUIET_LEVELS, default_signatures

VERSION = 1


def wanted(cfg: Config) -> bool:
    """Whether the host's supervisor has anything to enforce for this config."""
    return cfg.run.restart != "never" or cfg.watch.on_hang != "notify" or "kill" in (
        cfg.watch.on_diverge, cfg.watch.on_idle)


def compile_policy(cfg: Config) -> dict[str, Any] | None:
    """The launch request's ``restart`` object, or None when there is nothing to enforce
    (``restart = "never"`` and ``on_hang = "notify"``: the request stays as before)."""
    if not wanted(cfg):
        return None
    run = cfg.run
    sigs = default_signatures()
    table = [*sigs.specific, *sigs.wrappers, *([sigs.generic] if sigs.generic else [])]
    return {
        "version": VERSION,
        "restart": run.restart,
        "max_restarts": run.max_restarts,
        "restart_delay": run.restart_delay,
        "restart_delay_max": run.restart_delay_max,
        "thrash_failures": run.thrash_failures,
        "thrash_window": run.thrash_window,
        "on_hang": cfg.watch.on_hang,
        "hang_s": cfg.watch.hang_s,
        "on_diverge": cfg.watch.on_diverge,
        "on_idle": cfg.watch.on_idle,
        "idle_s": cfg.watch.idle_s,
        "gpu_wait": run.gpu_wait,
        "graces": list(run.graces),
        "signatures": [{"id": s.id, "title": s.title, "class": s.restart or "unclassified",
                        "wrapper": s.wrapper, "generic": s.generic, "serving_fatal": s.serving_fatal,
                        "persist": s.persist,
                        "patterns": [p.pattern for p in s.patterns]} for s in table],
        "lines": {
            "ansi": hosttext.ESCAPES.pattern,
            "worker": lineshapes.WORKER_PREFIX.pattern,
            "foreign": lineshapes.FOREIGN_PREFIX.pattern,
            "level": lineshapes.VLLM_PREFIX.pattern,
            "quiet": sorted(QUIET_LEVELS),
            "exception": failures.EXC_SHAPE.pattern,
            "interrupt": failures.INTERRUPT.pattern,
            "request_source": failures.REQUEST_SOURCE.pattern,
            "note_level": failures.NOTE_LEVEL.pattern,
            "note_retry": failures.NOTE_RETRY.pattern,
            "note_head": failures.NOTE_HEAD,
        },
    }
