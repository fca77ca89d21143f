"""``dra-gpu explain``: why a claim (or a pod's claims) can or cannot be allocated, and what
would make it fit. Exit status 0 when every explained claim fits somewhere, 1 when one does not,
2 when the object cannot be read."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dra_gpu.explain.analysis import Report


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain",
        help="say why a claim or pod cannot get its devices, and what would make it fit",
        description="Count, per node and pool, the devices that pass the DeviceClass selectors, "
        "each claim selector and the constraints, minus those allocated or tainted; name the "
        "first selector that rules devices out, with their attribute values.",
    )
    p.add_argument("target", nargs="?", help="pod/NAME or claim/NAME")
    p.add_argument("-f", "--filename", type=Path, help="a ResourceClaim(Template) YAML file")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    p.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig file (default: in-cluster, then $KUBECONFIG or ~/.kube/config)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: building the CLI parser must not load cel-python or the Kubernetes client.
    from dra_gpu.explain import analysis, source
    from dra_gpu.kube import errors
    from dra_gpu.kube.client import connect

    if bool(args.target) == bool(args.filename):
        print("explain: give pod/NAME, claim/NAME or -f FILE (one of them)", file=sys.stderr)
        return 2
    try:
        client = connect(args.kubeconfig, default_kubeconfig=True)
        if args.filename:
            targets = source.claims_in_file(args.filename, args.namespace)
        else:
            kind, _, name = str(args.target).partition("/")
            if kind in ("pod", "pods", "po"):
                targets = source.claims_of_pod(client, args.namespace, name)
            elif kind in ("claim", "resourceclaim", "resourceclaims"):
                targets = [source.claim(client, args.namespace, name)]
            else:
                print(f"explain: {args.target!r}: expected pod/NAME or claim/NAME", file=sys.stderr)
                return 2
        classes, slices, claims = source.cluster_state(client)
    except (source.SourceError, errors.ApiError) as err:
        print(f"explain: {err}", file=sys.stderr)
        return 2
    reports = [
        analysis.explain_claim(c, classes=classes, slices=slices, claims=claims) for c in targets
    ]
    print(output(reports, args.output))
    return 0 if all(r.satisfiable for r in reports) else 1


def output(reports: Sequence[Report], fmt: str) -> str:
    import yaml

    from dra_gpu.explain import render

    if fmt == "table":
        return "\n\n".join(render.as_table(r) for r in reports)
    data = [render.as_data(r) for r in reports]
    if fmt == "json":
        return json.dumps(data, indent=2, default=str)
    return yaml.safe_dump(data, sort_keys=False).rstrip()
