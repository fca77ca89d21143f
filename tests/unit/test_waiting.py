"""``e2e.waiting.wait_for``, the poll loop every tier shares.

Cases: the first truthy value is returned and falsy values (None, False, 0, empty) mean "not
yet"; exceptions of a ``retry_on`` type are retried and named on timeout; other exceptions
propagate at once; the timeout message names what was awaited and the last value seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.waiting import WaitTimeout, describe, wait_for


class Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"({status})")
        self.status, self.reason = status, reason


def sequence(*outcomes: Any) -> Callable[[], Any]:
    """A probe that returns (or raises) each outcome in turn, then keeps the last one."""
    remaining: Iterator[Any] = iter(outcomes)
    last: list[Any] = [None]

    def probe() -> Any:
        last[0] = next(remaining, last[0])
        if isinstance(last[0], BaseException):
            raise last[0]
        return last[0]

    return probe


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ((None, None, "ready"), "ready"),
        ((False, True), True),
        ((0, 3), 3),
        (([], ["slice"]), ["slice"]),
        (({}, {"kind": "Pod"}), {"kind": "Pod"}),
        ((Refused(404, "Not Found"), 7), 7),
    ],
    ids=["none", "false", "zero-count", "empty-list", "empty-dict", "retried-error"],
)
def test_returns_the_first_truthy_value(outcomes: tuple[Any, ...], expected: Any) -> None:
    probe = sequence(*outcomes)
    assert wait_for("it", probe, timeout=30, every=0, retry_on=(Refused,)) == expected


def test_an_error_not_listed_in_retry_on_propagates_at_once() -> None:
    calls: list[int] = []

    def probe() -> None:
        calls.append(1)
        raise RuntimeError("the plugin exited")

    with pytest.raises(RuntimeError, match="the plugin exited"):
        wait_for("the plugin", probe, timeout=30, every=0, retry_on=(Refused,))
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("outcomes", "last"),
    [
        ((None,), "(last: None)"),
        ((0,), "(last: 0)"),
        ((Refused(404, "Not Found"),), "(last: Refused 404: Not Found)"),
        ((Refused(503, "Unavailable"), None), "(last: None; earlier: Refused 503: Unavailable)"),
    ],
    ids=["none", "zero", "error", "value-after-error"],
)
def test_timeout_names_what_and_the_last_outcome(outcomes: tuple[Any, ...], last: str) -> None:
    with pytest.raises(WaitTimeout) as raised:
        # Long enough for a second call: the last outcome repeats from then on.
        probe = sequence(*outcomes)
        wait_for("the slices", probe, timeout=0.5, every=0.01, retry_on=(Refused,))
    assert str(raised.value) == f"timed out after 0.5s waiting for the slices {last}"
    assert isinstance(raised.value, AssertionError)  # a test that times out fails, not errors


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (Refused(404, "Not Found"), "Refused 404: Not Found"),
        (Refused(404, ""), "Refused: (404)"),
        (ValueError("two\n  lines"), "ValueError: two lines"),
        (ValueError("x" * 400), "ValueError: " + "x" * 285 + "..."),
    ],
    ids=["status-and-reason", "status-without-reason", "multi-line", "clipped"],
)
def test_describe_is_one_short_line(exc: BaseException, expected: str) -> None:
    assert describe(exc) == expected
