"""One way to print how long (issue 39): every clock of the app (the runs and process
tables, the progress panel, watch messages, the CLI) through `tui.state.format.duration`,
and the host's messages (remote/run/restartpolicy.py `span`, stdlib only) in the same words.

Ages as `kubectl get` prints them: seconds only while young, so a clock on screen moves
once a second for ten minutes, then once a minute; what the host sends that is not a
duration (negative beyond clock skew, NaN, infinite, absurdly large, not a number) reads
N/A, never a crash and never 0."""

from __future__ import annotations

import math

import pytest

from remote.run.restartpolicy import span
from tui.state.format import duration

MIN, HOUR, DAY = 60, 3600, 86400

TABLE = [
    (0, "0s"), (0.04, "0s"), (0.4, "0.4s"), (1.5, "1.5s"), (9.96, "10s"), (10, "10s"), (10.7, "10s"),
    (42, "42s"), (59, "59s"), (59.9, "59s"),
    (60, "1m"), (61, "1m1s"), (5 * MIN + 12, "5m12s"), (10 * MIN - 1, "9m59s"),
    (10 * MIN, "10m"), (10 * MIN + 59, "10m"), (37 * MIN, "37m"), (3 * HOUR - 1, "179m"),
    (3 * HOUR, "3h"), (3 * HOUR + 60, "3h1m"), (5 * HOUR + 12 * MIN + 30, "5h12m"), (8 * HOUR - 1, "7h59m"),
    (8 * HOUR, "8h"), (47 * HOUR + 59 * MIN, "47h"),
    (2 * DAY, "2d"), (3 * DAY + 4 * HOUR + 5 * MIN, "3d4h"), (8 * DAY - 1, "7d23h"), (8 * DAY, "8d"),
    (400 * DAY, "400d"),
    (-1, "0s"), (-1.9, "0s"),  # a second of clock skew between host and client
]

NOT_A_DURATION = [-2, -3600, math.nan, math.inf, -math.inf, 10**400, 1e300, 200 * 365 * DAY, None, True, "42", [1]]


@pytest.mark.parametrize(("seconds", "shown"), TABLE)
def test_a_duration_reads_as_kubectl_prints_an_age(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


@pytest.mark.parametrize("seconds", NOT_A_DURATION)
def test_what_is_not_a_duration_reads_na(seconds: object) -> None:
    assert duration(seconds) == "N/A"


@pytest.mark.parametrize(("seconds", "shown"), TABLE)
def test_the_host_says_a_duration_in_the_same_words(seconds: float, shown: str) -> None:
    assert span(seconds) == shown


@pytest.mark.parametrize("seconds", NOT_A_DURATION)
def test_the_host_says_na_for_what_is_not_a_duration(seconds: object) -> None:
    assert span(seconds) == "N/A"  # type: ignore[arg-type]


def test_a_clock_older_than_ten_minutes_moves_once_a_minute() -> None:
    """What the idle dashboard's cost rests on: fed one reading a second, a clock under
    ten minutes changes every second, one older once a minute, one older than eight
    hours once an hour."""
    def changes(start: int, seconds: int) -> int:
        shown = [duration(t) for t in range(start, start + seconds + 1)]
        return sum(a != b for a, b in zip(shown, shown[1:]))

    assert changes(0, 10 * MIN) == 10 * MIN
    assert changes(10 * MIN, HOUR) == 60
    assert changes(8 * HOUR, HOUR) == 1
