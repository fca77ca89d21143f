"""The command line: only real subcommands, and a version users can report."""

import ast
import os
import subprocess
import sys

import pytest

import dra_gpu
from dra_gpu import cli


def test_version_prints_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"dra-gpu {dra_gpu.__version__} ")


def test_no_subcommand_is_a_usage_error() -> None:
    assert cli.main([]) == 2


def test_console_entry_runs_as_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dra_gpu", "--help"], capture_output=True, text=True, check=True
    )
    assert "version" in proc.stdout


def _loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported after running ``statement``."""
    code = f"import sys; {statement}; print(sorted(m for m in {modules!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(ast.literal_eval(proc.stdout.strip()))


def test_parser_loads_no_heavy_libraries() -> None:
    # `dra-gpu discover` must run on a bare GPU host (only pynvml there), and the kubelet
    # plugin's start-up time and memory must not pay for the controller's libraries.
    heavy = ("kubernetes", "pydantic", "cryptography", "celpy")
    assert _loaded_after("from dra_gpu import cli; cli.build_parser()", heavy) == []


def test_plugin_main_loads_no_transport_until_it_runs() -> None:
    # The subcommand's module is imported for every `dra-gpu kubelet-plugin`, --help included;
    # gRPC and the API client load when the plugin starts serving (the layers themselves are
    # checked by lint-imports, which counts imports inside functions too).
    assert _loaded_after("import dra_gpu.plugin.main", ("grpc", "kubernetes", "urllib3")) == []


def test_plugin_settings_without_metrics_load_no_prometheus_client() -> None:
    # Metrics are off unless --metrics-address is given; off, the plugin must not pay the
    # library's import time and memory (issue 18's start-up and RSS rows).
    statement = (
        "from dra_gpu.plugin import settings; settings.build_settings({'node_name': 'n'}, {})"
    )
    assert _loaded_after(statement, ("prometheus_client",)) == []


def test_importing_the_grpc_side_leaves_fork_handlers_off() -> None:
    # gRPC core's fork handlers hung a subprocess spawn (fork) while gRPC threads were busy; the
    # plugin forks to run nvidia-smi and the MPS control daemon, so they must be off.
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, dra_gpu.kubeletplugin.dra_service; "
            "print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"},
    )
    assert out.stdout.strip() == "false"
