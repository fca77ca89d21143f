"""``python -m e2e.suite``: run the scenarios against the cluster of a kubeconfig.

Prints one line per scenario and ends with ``N passed, N failed``; exits non-zero on any failure.
A scenario refused for a reason this cluster's version is not known to have
(:func:`e2e.suite.needs.known_refusal`) did not run, and counts as failed.
``--cdi-dir`` (repeatable) lets it also verify CDI specs appear and disappear, when the nodes'
CDI directories are visible from here (they are not on kind, whose nodes are containers).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from e2e.suite import needs
from e2e.suite.kube import Kube
from e2e.suite.runner import Context, ScenarioFailed, run_scenario
from e2e.suite.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.suite", description=__doc__)
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG, then ~/.kube/config")
    parser.add_argument(
        "-k",
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only scenarios whose name contains NAME (repeatable)",
    )
    parser.add_argument("--cdi-dir", action="append", type=Path, default=[])
    parser.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--timeout", type=float, default=180.0, help="per wait, seconds")
    args = parser.parse_args(argv)
    selector = dict(item.split("=", 1) for item in args.node_selector)
    ctx = Context(
        kube=Kube.from_kubeconfig(args.kubeconfig),
        cdi_dirs=tuple(args.cdi_dir),
        timeout=args.timeout,
        node_selector=selector,
    )
    chosen = [s for s in SCENARIOS if not args.only or any(k in s.name for k in args.only)]
    passed = failed = refused = 0
    for scenario in chosen:
        print(f"[{scenario.name}] {scenario.summary}", flush=True)
        try:
            run_scenario(ctx, scenario)
            passed += 1
        except (ScenarioFailed, AssertionError) as e:
            print(f"  FAILED: {e}", flush=True)
            failed += 1
        except needs.Refused as e:
            version = needs.server_version(ctx.kube)
            if needs.known_refusal(version, str(e)) is None:
                print(f"  FAILED: NOT RUN, refused for a reason not known for {version}: {e}")
                failed += 1
            else:
                print(f"  REFUSED: {e}", flush=True)
                refused += 1
    print(f"{passed} passed, {failed} failed" + (f" ({refused} refused)" if refused else ""))
    return 1 if failed or not chosen else 0


if __name__ == "__main__":
    sys.exit(main())
