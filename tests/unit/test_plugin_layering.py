"""Layering of the kubelet plugin: core logic imports neither grpc nor any HTTP/Kubernetes client.

Each case imports modules in a fresh interpreter and lists the forbidden top-level packages
that got loaded. The subcommand module itself must stay light too, so ``dra-gpu --help`` does not
pay for grpc. The shared API client and the plugin's I/O modules over it load urllib3 but never
the official Kubernetes client (its start-up time and memory are what the plugin avoids).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = ("grpc", "kubernetes", "urllib3")


def loaded_forbidden(*modules: str, forbidden: tuple[str, ...] = FORBIDDEN) -> list[str]:
    code = (
        "import json, sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "top = {m.split('.')[0] for m in sys.modules}\n"
        + f"print(json.dumps(sorted(top & set({forbidden!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    names: list[str] = json.loads(out)
    return names


@pytest.mark.parametrize(
    "module",
    [
        "dra_gpu.kubeletplugin.slice_plan",
        "dra_gpu.kubeletplugin.publisher",
        "dra_gpu.plugin.settings",
        "dra_gpu.kube.errors",
        "dra_gpu.kube.credentials",
        "dra_gpu.kubeletplugin.sockets",
        "dra_gpu.plugin.inventory",
        "dra_gpu.plugin.main",
    ],
)
def test_core_module_imports_no_transport(module: str) -> None:
    assert loaded_forbidden(module) == []


@pytest.mark.parametrize(
    "module", ["dra_gpu.kube.client", "dra_gpu.kubeletplugin.slice_api", "dra_gpu.prepare.claims"]
)
def test_api_io_imports_no_official_client(module: str) -> None:
    assert loaded_forbidden(module, forbidden=("grpc", "kubernetes")) == []
