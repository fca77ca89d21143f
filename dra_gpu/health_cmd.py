"""``dra-gpu health``: inject a GPU health event (simulated nodes) or clear a GPU's taints.

Both append one line to the plugin's command file (``<state dir>/health-events.jsonl``), which
the running plugin reads within a fraction of a second; run it where that file is, e.g.
``kubectl exec`` into the plugin's pod. See docs/concepts/device-health.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dra_gpu import DRIVER_NAME
from dra_gpu.devices import health_events, health_rules
from dra_gpu.plugin.settings import DEFAULT_PLUGINS_DIR


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "health",
        help="inject a GPU health event (simulated nodes) or clear a GPU's taints",
        description="Talk to the running kubelet plugin of this node through its command file.",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the plugin's state directory "
        f"[env STATE_DIR; default {DEFAULT_PLUGINS_DIR / DRIVER_NAME}]",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    inject = actions.add_parser("inject", help="inject an event (the plugin must be simulated)")
    inject.add_argument("device", help="a device name (gpu-3; a MIG device means its GPU)")
    inject.add_argument("kind", choices=health_rules.EVENT_KINDS)
    inject.add_argument("code", type=int, nargs="?", default=0, help="the XID (kind xid)")
    clear = actions.add_parser("clear", help="clear the taints of a GPU now")
    clear.add_argument("device", help="a device name (gpu-3; a MIG device means its GPU)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or Path(
        os.environ.get("STATE_DIR") or DEFAULT_PLUGINS_DIR / DRIVER_NAME
    )
    doc = {"device": args.device, "clear": True}
    if args.action == "inject":
        doc = {"device": args.device, "kind": args.kind, "code": args.code}
    try:
        command = health_events.parse_command(doc)
    except health_events.CommandError as err:
        print(f"dra-gpu health: {err}", file=sys.stderr)
        return 2
    path = state_dir / health_events.FILE_NAME
    try:
        health_events.append(path, command)
    except OSError as err:
        print(f"dra-gpu health: cannot write {path}: {err}", file=sys.stderr)
        return 1
    print(f"written to {path}: {health_events.command_line(command).strip()}")
    return 0
