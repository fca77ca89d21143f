"""Prepare's core never imports gRPC or a Kubernetes client (only the thin adapters do).

Checked in a fresh interpreter, so imports made by other tests cannot hide a violation.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CORE = [
    "dra_gpu.config",
    "dra_gpu.prepare.cdi",
    "dra_gpu.prepare.cdi_host",
    "dra_gpu.prepare.cdi_validate",
    "dra_gpu.prepare.checkpoint",
    "dra_gpu.prepare.plan",
    "dra_gpu.prepare.records",
    "dra_gpu.prepare.state",
]
FORBIDDEN = ("grpc", "kubernetes", "urllib3")


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_io_client(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} pulls in {out.stdout.strip()}"
