"""Fail fast: every test has pyproject's timeout (120 s), so a hang is a failure within two
minutes, with every thread's stack, rather than CI's limit. A test that truly takes longer
says so and why, at the test:

    @pytest.mark.slow(timeout=900, reason="builds the real-vLLM env on a machine without its cache")

`apply` (tests/conftest.py, at collection) turns that into pytest-timeout's marker; a raw
``pytest.mark.timeout`` above the default, or a longer timeout without a reason, is a
collection error naming the test, so the bound cannot grow silently.
"""

from __future__ import annotations

import pytest

DEFAULT_S = 120.0  # pyproject.toml [tool.pytest.ini_options] timeout


def apply(items: list[pytest.Item]) -> None:
    bad = []
    for item in items:
        raw = item.get_closest_marker("timeout")
        if raw is not None and float(raw.args[0] if raw.args else raw.kwargs.get("timeout", 0)) > DEFAULT_S:
            bad.append(f"{item.nodeid}: a timeout above {DEFAULT_S:g} s is "
                       "@pytest.mark.slow(timeout=S, reason=...), not pytest.mark.timeout")
        slow = item.get_closest_marker("slow")
        if slow is None or "timeout" not in slow.kwargs:
            continue
        if not str(slow.kwargs.get("reason") or "").strip():
            bad.append(f"{item.nodeid}: slow(timeout={slow.kwargs['timeout']}) without a reason")
            continue
        item.add_marker(pytest.mark.timeout(float(slow.kwargs["timeout"])))
    if bad:
        raise pytest.UsageError("per-test timeouts (tests/timeouts.py):\n  " + "\n  ".join(bad))
