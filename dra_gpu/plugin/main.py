"""``dra-gpu kubelet-plugin``: flags -> settings -> running plugin until SIGTERM/SIGINT.

Kept thin: settings come from ``settings``, the process's parts from ``lifecycle``. Exit codes:
0 after a clean stop on a signal, 2 for unusable settings, 1 when start-up fails (the message
says what to fix). Heavy imports (grpc, the Kubernetes client) happen only once a command runs,
so ``dra-gpu --help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from dra_gpu.plugin import settings as plugin_settings

log = logging.getLogger("dra_gpu.plugin")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "kubelet-plugin",
        help="run the node plugin: register with the kubelet, publish ResourceSlices",
        description="Run the DRA kubelet plugin of this node. Every flag can also be set by "
        "the environment variable named in its help.",
    )
    plugin_settings.add_arguments(parser)
    parser.set_defaults(func=run)


# glibc's mallopt parameter for the number of malloc arenas (malloc.h: M_ARENA_MAX).
_M_ARENA_MAX = -8
MALLOC_ARENAS = 2


def limit_malloc_arenas() -> None:
    """At most :data:`MALLOC_ARENAS` malloc arenas instead of glibc's 8 per core.

    glibc gives a thread its own arena when another holds the lock, so the gRPC and worker
    threads of a burst of prepares left 15 arenas holding 5 MiB of RSS (``/proc/PID/smaps``
    after ``bench/reference.py``), and arenas are never given back. The threads that allocate
    run Python under one GIL, so more arenas buy no speed. Not glibc (no ``mallopt``):
    nothing to do.
    """
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_ARENA_MAX, MALLOC_ARENAS)


def run(args: argparse.Namespace) -> int:
    import os

    limit_malloc_arenas()  # before any thread starts

    try:
        settings = plugin_settings.build_settings(vars(args), os.environ)
    except plugin_settings.SettingsError as err:
        print(f"dra-gpu kubelet-plugin: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return serve(settings, stop)


def serve(settings: plugin_settings.Settings, stop: threading.Event) -> int:
    """Run the plugin until ``stop`` is set: 0, or 1 when it cannot start (logged)."""
    from dra_gpu.plugin import lifecycle

    try:
        plugin = lifecycle.KubeletPlugin.start(settings)
    except lifecycle.StartError as err:
        log.error("cannot start: %s", err)
        return 1
    try:
        while not stop.wait(0.5):
            pass
    finally:
        plugin.stop()
    return 0
