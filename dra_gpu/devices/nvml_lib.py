"""Find and load NVML (``libnvidia-ml.so.1``) under the driver root, for pynvml to use.

pynvml opens ``libnvidia-ml.so.1`` by its bare name, i.e. from the process's library path. In
the plugin's container the driver's libraries exist only under the mounted driver root (the
chart mounts the host's ``/`` at ``/driver-root``, or the GPU Operator's ``/run/nvidia/driver``
at that path), so the bare name finds nothing there.

Design and invariants:

* :func:`attempts` is pure: which files to try, in which order. A driver root other than ``/``
  tries the library files under it, and only when there is none the default library search (a
  host-installed driver visible in the container's own library path). Driver root ``/`` tries
  the default search first (the dynamic loader's cache knows the host's layout best), then the
  usual directories.
* A file under the root that is an absolute symbolic link points into the *driver root's*
  file system, not the plugin's: it is resolved inside the root.
* :func:`install` hands the handle to pynvml the way its own loader does: under
  ``libLoadLock``, only while ``nvmlLib`` is still unset. A library that is already loaded is
  never replaced (function pointers are cached against it).
* Loading failures are not cached: the next discovery pass tries again, as a driver container
  may mount its root after the plugin started.
* The ``open_library`` collaborator (``ctypes.CDLL`` by default) lets tests see which paths are
  opened without loading a fake file.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

LIBRARY_NAME: Final = "libnvidia-ml.so.1"
# Where distributions and the driver container put the 64-bit user-space libraries.
LIBRARY_DIRS: Final = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    # Cloud GPU images (and the H200 we test on) install the driver here.
    "usr/local/nvidia/lib64",
)
# What an attempt with the bare name is reported as.
DEFAULT_SEARCH: Final = f"{LIBRARY_NAME} (default library search path)"
_MAX_LINKS: Final = 40  # the kernel's own limit on a chain of symbolic links

OpenLibrary = Callable[[str], Any]


class NvmlLibraryError(RuntimeError):
    """No NVML library could be loaded; the message names every path tried and why it failed."""


@dataclass(frozen=True)
class Attempt:
    """One way to load NVML: ``path`` for dlopen, ``shown`` for messages."""

    path: str
    shown: str


def resolve_in_root(root: Path, path: Path) -> Path:
    """``path`` (under ``root``) with its symbolic links followed as if ``root`` were ``/``."""
    current = path
    for _ in range(_MAX_LINKS):
        if not current.is_symlink():
            return current
        target = Path(os.readlink(current))
        if target.is_absolute():
            current = root / target.relative_to("/")
        else:
            current = current.parent / target
    return current  # a loop: dlopen reports it


def find_libraries(driver_root: Path) -> list[Path]:
    """Existing ``libnvidia-ml.so.1`` files under the root's library directories, in order."""
    found: list[Path] = []
    seen: set[Path] = set()
    for directory in LIBRARY_DIRS:
        candidate = resolve_in_root(driver_root, driver_root / directory / LIBRARY_NAME)
        if not candidate.is_file():
            continue
        # lib64 -> usr/lib64 and friends: one file reached twice is tried once
        key = candidate.resolve()
        if key not in seen:
            seen.add(key)
            found.append(candidate)
    return found


def attempts(driver_root: Path, found: Sequence[Path]) -> list[Attempt]:
    """The order in which to try loading NVML (see the module docstring)."""
    default = Attempt(LIBRARY_NAME, DEFAULT_SEARCH)
    files = [Attempt(str(p), str(p)) for p in found]
    if driver_root == Path("/"):
        return [default, *files]
    return files or [default]


def load(driver_root: Path, *, open_library: OpenLibrary = ctypes.CDLL) -> tuple[Any, str]:
    """The first NVML library that loads, and what it was; raises NvmlLibraryError."""
    tried: list[str] = []
    found = find_libraries(driver_root)
    for attempt in attempts(driver_root, found):
        try:
            return open_library(attempt.path), attempt.shown
        except OSError as exc:
            tried.append(f"{attempt.shown}: {exc}")
    looked = ", ".join(f"{driver_root / d / LIBRARY_NAME}" for d in LIBRARY_DIRS)
    hint = "" if found or driver_root == Path("/") else f"; none of {looked} exists"
    raise NvmlLibraryError(
        f"cannot load NVML under driver root {driver_root}: tried {'; '.join(tried)}{hint} "
        "(check --driver-root)"
    )


def install(nvml: Any, handle: Any) -> bool:
    """Give pynvml ``handle`` as its library unless it has one; True when it was taken."""
    with nvml.libLoadLock:
        if nvml.nvmlLib is not None:
            return False
        nvml.nvmlLib = handle
        return True


def needs_library(nvml: Any) -> bool:
    """Whether ``nvml`` is a pynvml that has not loaded its library yet.

    Stand-ins for pynvml (tests) without pynvml's loader hooks need no library.
    """
    return hasattr(nvml, "libLoadLock") and getattr(nvml, "nvmlLib", None) is None
