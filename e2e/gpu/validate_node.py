"""``dra-gpu validate --node gpu-node`` in the GPU demo: the checks a platform engineer runs, on
the real GPU.

The demo's plugin is a process, not a pod, so validate asks its ``/readyz``
(``--plugin-readyz``); its check pods run the demo's check image (a shell, and ``nvidia-smi``
reaches them through the claim's CDI spec, as it reaches ``cuda-one``), in the demo's namespace,
and list the node's CDI root. Checks on what validate printed (:func:`judge`, pure):

- it exits 0 and prints PASS for node, plugin, slices, pod and cdi, in that order;
- its pod line names the device allocated to its claim and, from ``nvidia-smi -L`` in the check
  pod, that device's UUID as the slices publish it (validate itself fails the pod step when
  ``nvidia-smi -L`` lists another GPU; it names the UUID only when it listed exactly one);
- afterwards the Node carries ``gpu.nvidia.com/validated=<version>`` (:func:`judge_recorded`) and
  no pod or claim of validate is left (:func:`leftovers`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_gpu import DRIVER_NAME
from dra_gpu.validate.command import STEPS
from dra_gpu.validate.steps import validated_label
from e2e.kube_json import as_json
from e2e.suite.kube import RESOURCE, Kube

Check = tuple[str, bool, str]
SELECTOR = "app.kubernetes.io/name=dra-gpu-validate"
LABEL = validated_label(DRIVER_NAME)
_VERDICT = re.compile(r"^(?P<verdict>PASS|FAIL|SKIP)  (?P<step>[a-z]+)\b")
_POD = re.compile(
    r"^PASS  pod: pod (?P<pod>\S+) saw exactly (?P<devices>[^;]+?)"
    r"(?:, nvidia-smi -L: (?P<uuid>[^\s;]+))?(?:; (?P<access>.+))?$"
)


@dataclass(frozen=True)
class Ran:
    """What one run of validate gave."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def argv(
    *,
    node: str,
    kubeconfig: Path,
    namespace: str,
    readyz_url: str,
    image: str,
    cdi_root: Path,
    timeout_s: float,
) -> list[str]:
    """The command line, as a user would run it against this cluster."""
    return [
        *(sys.executable, "-m", "dra_gpu", "validate", "--node", node),
        *("--kubeconfig", str(kubeconfig), "--namespace", namespace),
        *("--plugin-readyz", readyz_url, "--image", image, "--cdi-root", str(cdi_root)),
        *("--timeout", f"{timeout_s:g}"),
    ]


def run(command: Sequence[str], *, timeout_s: float) -> Ran:
    """Run validate; one that outlives ``timeout_s`` is killed and judged (exit 124) with what
    it printed until then, rather than ending the demo."""
    try:
        done = subprocess.run(
            list(command), capture_output=True, text=True, check=False, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as err:
        printed = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return Ran(tuple(command), 124, printed, f"killed after {timeout_s:g} s")
    return Ran(tuple(command), done.returncode, done.stdout, done.stderr)


def verdicts(stdout: str) -> list[tuple[str, str]]:
    """(verdict, step) of each step line validate printed, in order."""
    return [
        (m["verdict"], m["step"]) for line in stdout.splitlines() if (m := _VERDICT.match(line))
    ]


def judge(ran: Ran, published: Mapping[str, str]) -> list[Check]:
    """The checks of validate's output; ``published``: device name -> UUID from the slices."""
    lines = ran.stdout.splitlines()
    said = verdicts(ran.stdout)
    pod = next((m for line in lines if (m := _POD.match(line))), None)
    devices = pod["devices"].split(", ") if pod else []
    uuid = (pod["uuid"] or "") if pod else ""
    expected = published.get(devices[0], "") if len(devices) == 1 else ""
    return [
        (
            "dra-gpu validate exits 0",
            ran.returncode == 0,
            (lines[-1] if lines else ran.stderr.strip()[-300:]) + f" (exit {ran.returncode})",
        ),
        (
            "dra-gpu validate passes node, plugin, slices, pod and cdi in order",
            said == [("PASS", step) for step in STEPS],
            ", ".join(f"{v} {s}" for v, s in said) or "no step line",
        ),
        (
            "validate's check pod saw its one device, nvidia-smi -L naming that GPU's UUID",
            bool(uuid) and uuid == expected,
            f"{', '.join(devices) or 'no pod line'}: nvidia-smi -L {uuid or 'listed nothing'}, "
            f"published {expected or '-'}",
        ),
    ]


def judge_recorded(labels: Mapping[str, str], version: str) -> Check:
    """The Node label a passed validation leaves, for a rollout to gate on."""
    value = labels.get(LABEL)
    return (f"the Node is labelled {LABEL}={version}", value == version, f"{LABEL}={value}")


def leftovers(kube: Kube, namespace: str) -> list[str]:
    """validate's pods and claims still in ``namespace`` (``kind/name``)."""
    pods = kube.as_dict(kube.core.list_namespaced_pod(namespace, label_selector=SELECTOR))
    claims = as_json(
        kube.custom.list_namespaced_custom_object(
            *RESOURCE, namespace, "resourceclaims", label_selector=SELECTOR
        )
    )
    return [f"pod/{p['metadata']['name']}" for p in pods.get("items", [])] + [
        f"resourceclaim/{c['metadata']['name']}" for c in claims.get("items", [])
    ]


def lines(ran: Ran) -> list[str]:
    """The report's section: the command as run and what it printed."""
    shown = ["$ dra-gpu " + " ".join(ran.argv[3:]), *ran.stdout.rstrip().splitlines()]
    if ran.returncode != 0 and ran.stderr.strip():
        shown += ["stderr:", *ran.stderr.rstrip().splitlines()[-20:]]
    return shown
