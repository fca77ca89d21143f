"""NVML is loaded from under the driver root (``dra_gpu.devices.nvml_lib`` and NvmlBackend).

Fake driver roots in temporary directories hold files named like the real library. Loading goes
through a recording ``open_library`` (no dlopen of a fake file), except in one test that
dlopens a real shared library (the C library this process already uses) through a link under
the fake root.

Cases: the library directories are searched in order and a library reached twice is tried once;
an absolute link under the root resolves inside the root; driver root ``/`` tries the default
search first, another root its own files and the default search only when it has none; a file
that fails to load falls through to the next; when nothing loads the error names every path and
why; NvmlBackend hands pynvml the library before nvmlInit, never replaces one already loaded,
reports a load failure as a backend error (nvmlInit untouched) and tries again on the next pass;
the installed pynvml has the hooks this relies on.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any

import pynvml
import pytest
from nvml_fakes import FakeGpu, FakeNvml

from dra_gpu.devices import nvml_lib
from dra_gpu.devices.nvml import NvmlBackend

LIB = nvml_lib.LIBRARY_NAME


class Recorder:
    """``open_library`` that records paths; paths in ``broken`` fail like a bad ELF file."""

    def __init__(self, *, broken: tuple[str, ...] = ()) -> None:
        self.opened: list[str] = []
        self.broken = broken

    def __call__(self, path: str) -> Any:
        self.opened.append(path)
        if path in self.broken:
            raise OSError(f"{path}: invalid ELF header")
        return f"handle:{path}"


class HookedNvml(FakeNvml):
    """A fake pynvml with pynvml's loader hooks; nvmlInit fails like pynvml without a library."""

    def __init__(self) -> None:
        super().__init__([FakeGpu(index=0, minor=0)])
        self.nvmlLib: Any = None
        self.libLoadLock = threading.Lock()

    def nvmlInit(self) -> None:
        if self.nvmlLib is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        super().nvmlInit()


def put(root: Path, directory: str, name: str = LIB) -> Path:
    path = root / directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


def test_directories_are_searched_in_order(tmp_path: Path) -> None:
    debian = put(tmp_path, "usr/lib/x86_64-linux-gnu")
    rhel = put(tmp_path, "usr/lib64")
    put(tmp_path, "usr/lib64", "libnvidia-ml.so.580.159.03")  # not the SONAME: not tried
    assert nvml_lib.find_libraries(tmp_path) == [rhel, debian]


def test_a_library_reached_through_a_linked_directory_is_tried_once(tmp_path: Path) -> None:
    real = put(tmp_path, "usr/lib64")
    (tmp_path / "lib64").symlink_to("usr/lib64")
    assert nvml_lib.find_libraries(tmp_path) == [real]


def test_an_absolute_link_resolves_inside_the_driver_root(tmp_path: Path) -> None:
    versioned = put(tmp_path, "usr/lib/x86_64-linux-gnu", "libnvidia-ml.so.580.159.03")
    link = tmp_path / "usr/lib/x86_64-linux-gnu" / LIB
    # as the host sees it; in the plugin's container this path does not exist
    link.symlink_to("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.159.03")
    assert nvml_lib.find_libraries(tmp_path) == [versioned]


@pytest.mark.parametrize(
    ("root", "found", "expected"),
    [
        ("/", [], [LIB]),
        ("/", ["/usr/lib64/" + LIB], [LIB, "/usr/lib64/" + LIB]),
        ("/driver-root", ["/driver-root/usr/lib64/" + LIB], ["/driver-root/usr/lib64/" + LIB]),
        ("/driver-root", [], [LIB]),
    ],
    ids=["host-root-default", "host-root-default-first", "root-files-only", "root-empty-default"],
)
def test_attempt_order(root: str, found: list[str], expected: list[str]) -> None:
    got = nvml_lib.attempts(Path(root), [Path(f) for f in found])
    assert [a.path for a in got] == expected


def test_load_opens_the_file_under_the_root_not_the_bare_name(tmp_path: Path) -> None:
    lib = put(tmp_path, "usr/lib/aarch64-linux-gnu")
    opener = Recorder()
    handle, shown = nvml_lib.load(tmp_path, open_library=opener)
    assert opener.opened == [str(lib)]
    assert (handle, shown) == (f"handle:{lib}", str(lib))


def test_a_file_that_does_not_load_falls_through_to_the_next(tmp_path: Path) -> None:
    bad = put(tmp_path, "usr/lib64")
    good = put(tmp_path, "usr/lib")
    opener = Recorder(broken=(str(bad),))
    handle, _ = nvml_lib.load(tmp_path, open_library=opener)
    assert opener.opened == [str(bad), str(good)]
    assert handle == f"handle:{good}"


def test_nothing_loads_names_every_path_and_why(tmp_path: Path) -> None:
    bad = put(tmp_path, "usr/lib64")
    opener = Recorder(broken=(str(bad),))
    with pytest.raises(nvml_lib.NvmlLibraryError) as err:
        nvml_lib.load(tmp_path, open_library=opener)
    assert f"{bad}: {bad}: invalid ELF header" in str(err.value)
    assert "--driver-root" in str(err.value)
    assert opener.opened == [str(bad)], "a broken file under the root is not replaced by a guess"


def test_empty_root_falls_back_to_the_default_search_and_says_where_it_looked(
    tmp_path: Path,
) -> None:
    opener = Recorder(broken=(LIB,))
    with pytest.raises(nvml_lib.NvmlLibraryError) as err:
        nvml_lib.load(tmp_path, open_library=opener)
    assert opener.opened == [LIB]
    message = str(err.value)
    assert nvml_lib.DEFAULT_SEARCH in message
    for directory in nvml_lib.LIBRARY_DIRS:
        assert str(tmp_path / directory / LIB) in message


def test_real_dlopen_of_a_library_under_the_root(tmp_path: Path) -> None:
    libc = next(
        Path(line.split()[-1])
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "/libc.so" in line or "/libc-" in line
    )
    libdir = tmp_path / "usr/lib64"
    libdir.mkdir(parents=True)
    # A link, not a copy: dlopen finds the C library already loaded and loads no second one.
    # Relative, as an absolute one would be read inside the fake root.
    (libdir / LIB).symlink_to(os.path.relpath(libc, libdir))
    handle, shown = nvml_lib.load(tmp_path)
    assert isinstance(handle, ctypes.CDLL)
    assert shown.startswith(f"{libdir}/") and Path(shown).resolve() == libc.resolve()
    assert handle.getpid  # a real symbol of the real library


def test_backend_hands_pynvml_the_library_before_init(tmp_path: Path) -> None:
    lib = put(tmp_path, "usr/lib/x86_64-linux-gnu")
    fake, opener = HookedNvml(), Recorder()
    d = NvmlBackend(nvml=fake, driver_root=tmp_path, open_library=opener).discover()
    assert d.errors == () and len(d.gpus) == 1
    assert fake.nvmlLib == f"handle:{lib}"
    assert fake.calls[0] == "nvmlInit"


def test_backend_never_replaces_a_loaded_library(tmp_path: Path) -> None:
    put(tmp_path, "usr/lib64")
    fake, opener = HookedNvml(), Recorder()
    fake.nvmlLib = "already"
    assert NvmlBackend(nvml=fake, driver_root=tmp_path, open_library=opener).discover().gpus
    assert (fake.nvmlLib, opener.opened) == ("already", [])


def test_load_failure_is_a_backend_error_and_retried_next_pass(tmp_path: Path) -> None:
    fake, opener = HookedNvml(), Recorder(broken=(LIB,))
    backend = NvmlBackend(nvml=fake, driver_root=tmp_path, open_library=opener)
    first = backend.discover()
    assert first.gpus == ()
    (error,) = first.errors
    assert error.index is None and f"cannot load NVML under driver root {tmp_path}" in error.message
    assert "nvmlInit" not in fake.calls

    lib = put(tmp_path, "usr/lib64")  # the driver container mounted its root meanwhile
    second = backend.discover()
    assert second.errors == () and len(second.gpus) == 1
    assert fake.nvmlLib == f"handle:{lib}"


def test_installed_pynvml_has_the_loader_hooks() -> None:
    assert hasattr(pynvml, "libLoadLock") and hasattr(pynvml, "nvmlLib")
    assert hasattr(pynvml, "_LoadNvmlLibrary")


def test_cloud_image_driver_directory_is_searched(tmp_path: Path) -> None:
    # The H200 machines we test on keep the driver in /usr/local/nvidia/lib64 (ldconfig -p).
    lib = put(tmp_path, "usr/local/nvidia/lib64")
    assert nvml_lib.find_libraries(tmp_path) == [lib]
