"""Calls with a bounded wait, for libraries that can block forever (NVML on a wedged GPU).

A call runs on a worker thread and the caller waits at most ``timeout_s``. Python cannot kill a
thread stuck inside C code, so on timeout the worker is *abandoned*: it is a daemon thread (it
never blocks interpreter exit), it gets a stop marker queued behind the stuck call, and the next
call starts a fresh worker. Calls through one ``BoundedCaller`` are serialized (one in flight),
which matches NVML's own global lock and keeps a hang from piling up threads.

The plugin re-discovers every minute, so a driver that stays wedged would abandon workers
forever. Once ``max_stuck`` abandoned workers are still inside their calls, a call fails at
once without a new thread; when the driver lets them go, they exit and calls run again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_Work = tuple["Future[Any]", Callable[[], Any]]


class CallTimeoutError(TimeoutError):
    """A bounded call did not return in time; the message names the call."""


def _worker(work: queue.SimpleQueue[_Work | None]) -> None:
    while (item := work.get()) is not None:
        fut, fn = item
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(fn())
        except BaseException as e:  # handed to the waiting caller, who re-raises it
            fut.set_exception(e)


class BoundedCaller:
    def __init__(self, *, timeout_s: float, name: str = "bounded-call", max_stuck: int = 4) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.timeout_s = timeout_s
        self.max_stuck = max_stuck
        self._name = name
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[_Work | None] | None = None
        self._thread: threading.Thread | None = None
        self._stuck: list[threading.Thread] = []

    @property
    def stuck_workers(self) -> int:
        """Abandoned workers still inside their call."""
        self._stuck = [t for t in self._stuck if t.is_alive()]
        return len(self._stuck)

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn()`` and return its result or raise its exception, waiting ``timeout_s``."""
        with self._lock:
            if self.stuck_workers >= self.max_stuck:
                raise CallTimeoutError(
                    f"{what} not called: {len(self._stuck)} earlier calls are still stuck "
                    "(the GPU driver may be hung)"
                )
            work = self._ensure_worker()
            fut: Future[T] = Future()
            work.put((fut, fn))
            try:
                return fut.result(timeout=self.timeout_s)
            except TimeoutError:
                if fut.done():  # fn itself raised a TimeoutError
                    raise
                fut.cancel()
                self._abandon(work)
                raise CallTimeoutError(
                    f"{what} did not return within {self.timeout_s:g}s "
                    "(the GPU driver may be hung); gave up waiting"
                ) from None

    def _ensure_worker(self) -> queue.SimpleQueue[_Work | None]:
        if self._work is None:
            work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
            thread = threading.Thread(target=_worker, args=(work,), name=self._name, daemon=True)
            thread.start()
            self._work, self._thread = work, thread
        return self._work

    def _abandon(self, work: queue.SimpleQueue[_Work | None]) -> None:
        work.put(None)  # the stuck worker exits if its call ever returns
        if self._thread is not None:
            self._stuck.append(self._thread)
        self._work, self._thread = None, None
