"""``dra-gpu top [-n NS | -A] [--node N] [-o table|json]`` (also ``kubectl gpu top``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", default="default", help="claims of this namespace")
    p.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="every device of every node, claimed or not",
    )
    p.add_argument("--node", default=None, help="only this node's devices")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument(
        "--plugin-namespace",
        default="dra-gpu",
        help="namespace of the driver's kubelet plugin pods (default dra-gpu)",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        default=None,
        help="read from this Prometheus server instead of the plugins",
    )
    p.add_argument(
        "--metrics-url",
        metavar="URL",
        action="append",
        default=[],
        help="read this plugin /metrics URL instead (repeatable; e.g. after kubectl port-forward)",
    )
    p.add_argument("--kubeconfig", type=Path, default=None, help="API server credentials")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "top",
        help="GPU utilization, memory and idle time by node, device, claim and pod",
        description="Like kubectl top, for the GPUs of this driver: read from each node's "
        "kubelet plugin through the API server (or from Prometheus).",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dra_gpu.top import rows, source

    warnings: list[str] = []
    try:
        if args.prometheus:
            samples = source.from_prometheus(args.prometheus)
        elif args.metrics_url:
            samples = source.from_urls(args.metrics_url)
        else:
            from dra_gpu.kube.client import connect

            client = connect(args.kubeconfig, default_kubeconfig=True)
            try:
                samples, warnings = source.from_plugins(
                    client, namespace=args.plugin_namespace, node=args.node
                )
            finally:
                client.close()
    except source.SourceError as err:
        print(f"dra-gpu top: {err}", file=sys.stderr)
        return 1
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    found = rows.build_rows(
        samples, namespace=None if args.all_namespaces else args.namespace, node=args.node
    )
    if args.output == "json":
        print(rows.to_json(found))
    elif found:
        print(rows.table(found))
    else:
        where = "" if args.all_namespaces else f" claimed in namespace {args.namespace}"
        print(f"No GPUs{where}.", file=sys.stderr)
    return 0


def kubectl_main() -> int:
    """``kubectl gpu top ...``: kubectl runs ``kubectl-gpu top ...``."""
    parser = argparse.ArgumentParser(prog="kubectl gpu", description="GPUs of the dra-gpu driver")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register(sub)
    args = parser.parse_args()
    return int(args.func(args))
