"""Polling with a deadline: the one "wait until ready" loop of the harness, tests and benchmarks.

Everything a test or benchmark waits for (an API object, a log line, a socket, a process being
healthy) settles asynchronously, so they all poll. Invariants of ``wait_for``:

- The probe decides readiness by its value: the first *truthy* value is returned. ``None``,
  ``False``, ``0`` and empty collections all mean "not yet", so a probe may return the thing it
  looked for (a list of slices, a count, an object) and the caller gets it back.
- It never hangs: after ``timeout`` seconds it raises ``WaitTimeout`` (an ``AssertionError``, so
  a test fails rather than errors), naming what it waited for and the last thing it saw.
- Only the exception types in ``retry_on`` count as "not yet" (e.g. an API server that still
  answers 404); any other exception propagates at once. A probe that watches a process can
  therefore raise to stop the wait as soon as the process died.

Standard library only: bench scripts and unit tests import it without the kubernetes client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_CLIP = 300  # characters of the last value or error quoted in the timeout message


class WaitTimeout(AssertionError):
    """The awaited condition did not hold within the deadline."""


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float,
    every: float = 0.3,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``probe`` every ``every`` seconds until it returns a truthy value, and return that.

    An exception of a ``retry_on`` type counts as "not yet" and is named in the timeout message.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
        except retry_on as e:
            last_error, seen = e, describe(e)
        else:
            if value:
                return value
            seen = _clip(repr(value))
            if last_error is not None:  # an earlier error may explain a later "not yet"
                seen += f"; earlier: {describe(last_error)}"
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what} (last: {seen})")
        time.sleep(every)


def describe(exc: BaseException) -> str:
    """One line for an exception; an API error (ours or the kubernetes client's) by its status."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None and reason:
        return f"{type(exc).__name__} {status}: {reason}"
    return _clip(f"{type(exc).__name__}: {' '.join(str(exc).split())}")


def _clip(text: str) -> str:
    return text if len(text) <= _CLIP else text[: _CLIP - 3] + "..."
