"""Unix sockets that appear only when they are owner-only and listening.

The kubelet watches the registry directory with inotify and connects as soon as a socket shows
up, so a socket must never be visible under its real name before it has its final permissions.
A socket is therefore bound inside a fresh private directory (mode 0700, a dot name the
kubelet ignores) next to its final place, chmod-ed to 0600, and then renamed into place: the
rename is atomic and stays on one file system, since the directory sits beside the target.

No grpc here: callers pass ``bind``, a function that makes their server listen on an address.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
# What an instance's name (its pod UID) may be, so that it fits in a socket's file name.
POD_UID_PATTERN = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9]{0,62}$")
# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_PATH = 107


class SocketError(OSError):
    """A socket could not be created or placed; the message names the path."""


def prepare_dir(path: Path) -> None:
    """Create a socket directory (0750 when new)."""
    try:
        path.mkdir(mode=0o750, parents=True, exist_ok=True)
    except OSError as err:
        raise SocketError(f"cannot create socket directory {path}: {err}") from err


def remove_stale(path: Path) -> None:
    """Remove a socket left behind at ``path`` by an earlier instance with the same name."""
    with contextlib.suppress(FileNotFoundError):
        if path.is_socket():
            path.unlink()
            log.info("removed stale socket %s", path)
        elif path.exists():
            raise SocketError(f"{path} exists and is not a socket; refusing to replace it")


def listen_private(final: Path, bind: Callable[[str], object]) -> Path:
    """Bind a socket for ``final`` in a private directory; returns where it listens now.

    Call ``publish`` once the server is started to move it to ``final``.
    """
    prepare_dir(final.parent)
    for stale in final.parent.glob(f".{final.name}.*"):
        # Left by an instance of the same name that died between bind and publish.
        shutil.rmtree(stale, ignore_errors=True)
    private = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    temporary = private / "s"
    try:
        _bind_in(private, temporary.name, bind)
        os.chmod(temporary, SOCKET_MODE)
    except Exception as err:
        shutil.rmtree(private, ignore_errors=True)
        raise SocketError(f"cannot listen on {final}: {err}") from err
    return temporary


def _bind_in(directory: Path, name: str, bind: Callable[[str], object]) -> None:
    # The private directory's name is longer than the final socket name, so a final path that
    # fits sun_path can yield a temporary one that does not. Binding through the directory's
    # descriptor in /proc keeps the address short whatever the directory's path length.
    direct = directory / name
    if len(str(direct).encode()) <= MAX_PATH:
        bind(f"unix:{direct}")
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        bind(f"unix:/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


def publish(temporary: Path, final: Path) -> None:
    """Move a listening socket to its final name (atomic) and drop its private directory."""
    remove_stale(final)
    try:
        os.replace(temporary, final)
    except OSError as err:
        raise SocketError(f"cannot move socket to {final}: {err}") from err
    finally:
        shutil.rmtree(temporary.parent, ignore_errors=True)


def accepts(path: Path, timeout_s: float = 1.0) -> bool:
    """Whether something listens on the unix socket ``path`` (a stale file does not)."""
    if not path.is_socket() or len(str(path).encode()) > MAX_PATH:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout_s)
        try:
            client.connect(str(path))
        except OSError:
            return False
    return True


def remove(path: Path) -> None:
    """Remove our socket; a missing one is fine (shutdown may run twice)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@dataclasses.dataclass(frozen=True)
class SocketPaths:
    """Where an instance listens and which file serializes calls across instances."""

    registration: Path
    dra: Path
    lock: Path


def socket_paths(
    *, driver_name: str, registry_dir: Path, data_dir: Path, pod_uid: str | None
) -> SocketPaths:
    """Socket names: defaults, or per-instance names in rolling-update mode (``pod_uid``).

    The kubelet tells instances apart by their registration socket; the newest one it connected
    to gets the calls. The lock file is shared by all instances of the driver on the node.
    """
    if pod_uid is None:
        reg_name, dra_name = f"{driver_name}-reg.sock", "dra.sock"
    else:
        reg_name, dra_name = f"{driver_name}-{pod_uid}-reg.sock", f"dra-{pod_uid}.sock"
    return SocketPaths(
        registration=registry_dir / reg_name,
        dra=data_dir / dra_name,
        lock=data_dir / "calls.lock",
    )
