"""The driver deployed as users deploy it: image size, start-up and upgrade figures.

``.venv/bin/python bench/deployed.py``

Brings up what ``make e2e-deployed`` does (``e2e.deployed.env``: the image built with ``docker
build`` from the Dockerfile, a local control plane, two real kubelet + containerd nodes,
kube-proxy), then runs only the checks that measure (``e2e.deployed``) and prints:

- the image's size (``docker image inspect``: the uncompressed size of its layers);
- plugin pod created -> its node's ResourceSlices published, per node (polled every 0.2 s);
- ``helm install`` started -> the first GPU pod Running (its claim template is created as soon as
  the API server admits it, i.e. once the webhook answers);
- the ``helm upgrade --wait`` of both releases to a second image tag, with pods holding claims;
- how long prepare was unavailable during it: per node, the time with no plugin registration
  socket in the kubelet's registry directory (sampled every 50 ms), and the number of
  ``FailedPrepareDynamicResources`` events (the target for both: zero);
- pods started during the rollout and the slowest of them (create -> Running).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from e2e.deployed.env import DeployedEnv
from e2e.deployed.run import Checks, Report, deployed


def main() -> int:
    report = Report()
    with deployed(DeployedEnv(), report) as env:
        checks = Checks(env, report, log=lambda line: None)
        for name, body in (
            ("install", checks.install),
            ("upgrade", checks.upgrade),
            ("uninstall", checks.uninstall),
        ):
            if not checks.check(name, body):
                break
    print()
    for key, value in report.figures.items():
        print(f"{key:70} {value:8.2f}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
