"""The simulated profile ``--simulate`` names: a built-in one, or a profile file.

Apart from ``simulated`` (the profiles as data and the backend) and ``simfile`` (files, which
builds on ``simulated``), so neither imports the other back. ``simfile`` (pydantic, yaml) is
imported only when a path is given.
"""

from __future__ import annotations

from pathlib import Path

from dra_gpu.devices.simulated import BUILTIN_PROFILES, ProfileError, SimProfile


def resolve_profile(spec: str) -> SimProfile:
    """A built-in profile name (``h200x8``...) or the path of a profile file."""
    builtin = BUILTIN_PROFILES.get(spec)
    if builtin is not None:
        return builtin
    path = Path(spec)
    if path.is_file():
        from dra_gpu.devices import simfile  # pydantic only when a file is read

        return simfile.load_profile_file(path)
    names = ", ".join(sorted(BUILTIN_PROFILES))
    raise ProfileError(f"no built-in profile or file named {spec!r} (built-in: {names})")
