"""``dra-gpu remove-node-labels``: take the GPU labels the kubelet plugin wrote off the Nodes.

The chart runs it as a pre-delete hook (``kubeletPlugin.nodeLabels.removeOnUninstall``), so an
uninstalled driver leaves no ``nvidia.com/gpu.product`` behind that pods would still select.
Without ``--node``: every node carrying the plugin's marker label (``devices.node_labels.MARKER``).
Only the keys the plugin writes are removed; other labels, GPU Feature Discovery's own included,
stay unless they are among those keys (GFD writes them again on its next pass).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "remove-node-labels",
        help="remove the GPU labels the kubelet plugin wrote on Nodes (uninstall)",
        description="Remove the nvidia.com/ labels the kubelet plugin keeps on its Node "
        "(--node-labels), from the named nodes or from every node it labelled.",
    )
    parser.add_argument("--kubeconfig", type=Path, default=None, help="default: in-cluster")
    parser.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME",
        help="a node to clean (repeatable; default: every node with the plugin's marker label)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dra_gpu.kube import errors
    from dra_gpu.kube.client import connect
    from dra_gpu.plugin import node_labels

    try:
        client = connect(args.kubeconfig, default_kubeconfig=True)
        nodes = list(args.node) or node_labels.labelled_nodes(client)
    except errors.ApiError as err:
        print(f"dra-gpu remove-node-labels: {err}", file=sys.stderr)
        return 1
    failed = 0
    for node in nodes:
        try:
            removed = node_labels.remove(client, node)
        except errors.ApiError as err:
            print(f"node {node}: {err}", file=sys.stderr)
            failed += 1
            continue
        print(f"node {node}: removed {len(removed)} labels")
    if not nodes:
        print("no node carries the plugin's labels")
    return 1 if failed else 0
