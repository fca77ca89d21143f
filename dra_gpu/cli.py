"""Command line entry point.

Each subcommand lives in its own module and contributes a ``register(subparsers)`` function;
this module only wires them together so that ``dra-gpu --help`` lists real commands only.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any

import dra_gpu

# Modules that provide subcommands, in the order --help lists them. Each has
# ``register(subparsers)`` that adds its parser and sets ``func`` on it.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "dra_gpu.controller.command",
    "dra_gpu.discover_cmd",
    "dra_gpu.explain.command",
    "dra_gpu.health_cmd",
    "dra_gpu.plugin.main",
    "dra_gpu.plugin.labels_cmd",
    "dra_gpu.top.command",
    "dra_gpu.validate.command",
)


def _cmd_version(_: argparse.Namespace) -> int:
    print(f"dra-gpu {dra_gpu.__version__} (python {platform.python_version()})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-gpu",
        description="Kubernetes DRA driver for NVIDIA GPUs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    version = sub.add_parser("version", help="print the version and exit")
    version.set_defaults(func=_cmd_version)
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], Any] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
