"""``make demo``'s environment, on simulated nodes: what the chart installs, bad input refused.

The demo runs the controller with its admission webhook, registered for the whole cluster like
the chart's ValidatingWebhookConfiguration, so its bad-input example (``invalid-config``) is
refused when it is applied, and its row says so and why, instead of the pod failing at prepare.
With real nodes turned off, the nodes are simulated on purpose: the ending names them and why,
in one line, without a warning. The dynamic-MIG
node's example gets a MIG device created for its claim, and its row shows that device. The
time-slicing example's row shows the interval set on its GPU, and its reset once the pod is gone.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.demo import dynamic_mig as demo_dynamic_mig
from e2e.demo import env as demo_env
from e2e.demo import run as demo
from e2e.demo import sharing as demo_sharing
from e2e.demo import view as demo_view
from e2e.suite.kube import Kube


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[demo_env.Environment]:
    monkeypatch.setenv("DRA_GPU_DEMO_REAL_NODES", "no")
    workdir = Path(tempfile.mkdtemp(prefix="demo-"))  # short: plugin sockets live below it
    env = demo_env.Environment(workdir)
    try:
        env.up()
        yield env
    finally:
        env.down()
        shutil.rmtree(workdir, ignore_errors=True)


def test_bad_input_is_refused_at_admission_and_the_ending_names_the_simulated_nodes(
    environment: demo_env.Environment,
) -> None:
    state = environment.state()
    kube = Kube.from_kubeconfig(state.kubeconfig)
    entries = demo.apply_scenarios(kube, state)

    refused = [e for e in entries if isinstance(e, demo_view.Row)]
    assert [(r.pod, r.claim, r.source) for r in refused] == [
        ("invalid-config/invalid-config", "ResourceClaimTemplate invalid-config", "admission")
    ]
    assert "mpsConfig" in refused[0].saw
    assert not kube.pod_exists("demo-invalid-config", "invalid-config")
    created = [e for e in entries if not isinstance(e, demo_view.Row)]
    assert ("demo-one-gpu", "one-gpu") in created

    observed = demo.observe(kube, state, *demo_dynamic_mig.apply(kube))
    (row,) = demo_dynamic_mig.with_created(observed, state)
    assert (row.node, row.source) == (demo_env.DYNAMIC_MIG_NODE, "cdi")
    assert row.devices == "gpu-0-mig-3g40gb-9-4", row  # 3g and larger are placed top-down
    assert "MIG 3g.40gb" in row.saw and "created MIG-" in row.saw, row

    example = demo_sharing.apply(kube, state)
    observed = demo.observe(kube, state, example.namespace, example.pod)
    (row,) = demo_sharing.applied_and_reset(observed, kube, state, example)
    assert (row.node, row.source) == (demo_env.SHARING_NODE, "cdi"), row
    applied, _, reset = row.saw.partition("pod deleted, unprepare ran (recorded):")
    (uuid,) = re.findall(r"-i (GPU-\S+) --set-timeslice 3", applied)  # Long, on the claimed GPU
    assert reset.split() == ["nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", "0"]
    assert not kube.pod_exists(example.namespace, example.pod)

    # Simulated on purpose: said in one line, and no warning.
    ending = demo.result_text(state, refused)
    assert ending.startswith("Pods on simulated nodes (no kubelet)"), ending
    assert ending.splitlines()[-1] == (
        "Simulated on purpose (no kubelet): demo-h200, demo-a100, demo-h100-dyn, "
        "real nodes off (DRA_GPU_DEMO_REAL_NODES=no)."
    )
    assert "NO CONTAINER RAN" not in ending
