"""Layering of the kubelet plugin: core logic imports neither grpc nor any HTTP/Kubernetes client.

Each case imports modules in a fresh interpreter and lists the forbidden top-level packages
that got loaded. The subcommand module itself must stay light too, so ``dra-gpu --help`` does not
pay for grpc.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = ("grpc", "kubernetes", "urllib3")


def loaded_forbidden(*modules: str) -> list[str]:
    code = (
        "import json, sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "top = {m.split('.')[0] for m in sys.modules}\n"
        + f"print(json.dumps(sorted(top & set({FORBIDDEN!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    names: list[str] = json.loads(out)
    return names


@pytest.mark.parametrize(
    "module",
    [
        "dra_gpu.plugin.slice_plan",
        "dra_gpu.plugin.publisher",
        "dra_gpu.plugin.settings",
        "dra_gpu.plugin.apierrors",
        "dra_gpu.plugin.sockets",
        "dra_gpu.plugin.inventory",
        "dra_gpu.plugin.main",
    ],
)
def test_core_module_imports_no_transport(module: str) -> None:
    assert loaded_forbidden(module) == []
