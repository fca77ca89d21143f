"""``dra-gpu validate``'s judgements, each from objects as the API server returns them.

Cases: no plugin pod names the DaemonSet and what to compare; a plugin pod that is not Ready
says why and names its log; a Ready one passes; a node without devices says it has no GPUs;
slices agreeing with the node labels pass, a count that differs fails naming the label; without
labels the slices pass and say there was nothing to compare; an incomplete pool fails; the
container report: exactly the allocated device passes (with nvidia-smi's UUID on a real GPU),
another device or a missing device node fails naming the layer; an incomplete report is None;
a leftover CDI spec fails naming unprepare; a pod that was not scheduled blames allocation (with
an ordinary claim: validate needs a free device; with admin access: not busy devices), one
that failed to prepare blames the plugin; the check claim asks for admin access; only the API
server's refusal for the namespace label, or its dropping the field (feature off), makes it an
ordinary claim, and the pod line says why; every line says PASS or FAIL and the step; the
validated label and version come from the driver and the image tag; the end-to-end sequence
against a fake API: a node that does not exist stops at the first step and exits 1.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.devices import node_labels
from dra_gpu.plugin import inventory, node_plugin, platforms
from dra_gpu.plugin import settings as plugin_settings
from dra_gpu.validate import steps
from dra_gpu.validate.command import Options, Validation


def plugin_pod(phase: str = "Running", ready: str = "True", message: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": "p1", "namespace": "dra-gpu"},
        "spec": {"containers": [{"image": "registry.example/dra-gpu:0.3.1"}]},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": ready, "message": message}],
        },
    }


def slices_of(profile: str, node: str = "n1") -> list[dict[str, Any]]:
    settings = plugin_settings.build_settings({"node_name": node, "simulate": profile}, {})
    devices = inventory.discover(
        inventory.backend_for(platforms.for_node(simulate=profile, node_name=node))
    )
    rendered = node_plugin.renderer(settings, devices)("uid-1")
    return [dict(s) for s in rendered]


def labels_of(profile: str) -> dict[str, str]:
    return node_labels.node_labels(
        inventory.discover(
            inventory.backend_for(platforms.for_node(simulate=profile, node_name="n1"))
        )
    )


def test_no_plugin_pod_names_the_daemonset() -> None:
    verdict = steps.judge_plugin_pods([], "n1")
    assert not verdict.ok
    assert "no kubelet plugin pod on node n1" in verdict.said
    assert verdict.layer == "1. the plugin pod (its DaemonSet)"
    assert "nvidia.com/gpu.present" in verdict.look
    assert verdict.line().startswith("FAIL  plugin: no kubelet plugin pod on node n1")


def test_a_plugin_pod_not_ready_says_why() -> None:
    verdict = steps.judge_plugin_pods([plugin_pod(ready="False", message="readyz 503")], "n1")
    assert not verdict.ok and "readyz 503" in verdict.said
    assert "kubectl logs -n dra-gpu p1" in verdict.look
    assert steps.judge_plugin_pods([plugin_pod()], "n1").ok


def test_readyz_of_a_plugin_that_is_no_pod() -> None:
    assert steps.judge_readyz("http://h:1/readyz", 200, "ok").ok
    refused = steps.judge_readyz("http://h:1/readyz", None, "Connection refused")
    assert not refused.ok and "answered nothing" in refused.said


def test_a_node_without_devices_has_no_gpus() -> None:
    verdict = steps.judge_slices([], {}, "n1", "gpu.nvidia.com")
    assert not verdict.ok
    assert "publishes no devices of gpu.nvidia.com" in verdict.said
    assert "no GPUs" in verdict.said


def test_slices_matching_discovery_pass() -> None:
    verdict = steps.judge_slices(slices_of("h200x8"), labels_of("h200x8"), "n1", "gpu.nvidia.com")
    assert verdict.ok, verdict.line()
    assert verdict.said == "8 devices on 8 GPUs, matching discovery (8 x NVIDIA-H200)"
    # MIG devices count their parent GPU once.
    mig = steps.judge_slices(slices_of("a100x4-mig"), labels_of("a100x4-mig"), "n1", "x")
    assert mig.ok and "on 4 GPUs" in mig.said, mig.line()


def test_slices_differing_from_discovery_fail() -> None:
    labels = {**labels_of("h200x8"), node_labels.COUNT: "7"}
    verdict = steps.judge_slices(slices_of("h200x8"), labels, "n1", "gpu.nvidia.com")
    assert not verdict.ok and "discovery found 7" in verdict.said
    assert node_labels.COUNT in verdict.said


def test_slices_without_labels_pass_saying_so() -> None:
    verdict = steps.judge_slices(slices_of("h200x8"), {}, "n1", "gpu.nvidia.com")
    assert verdict.ok and "--node-labels off" in verdict.said


def test_an_incomplete_pool_fails() -> None:
    (one,) = slices_of("h200x8")
    one["spec"] = {**one["spec"], "pool": {**one["spec"]["pool"], "resourceSliceCount": 2}}
    verdict = steps.judge_slices([one], labels_of("h200x8"), "n1", "gpu.nvidia.com")
    assert not verdict.ok and "incomplete" in verdict.said


REPORT = """== env
GPU_DEVICE_3=gpu-3
HOME=/root
== devices
/dev/nvidia-uvm
/dev/nvidia-uvm-tools
/dev/nvidia3
/dev/nvidiactl
== nvidia-smi
{smi}== end
"""


def test_the_container_saw_exactly_its_device() -> None:
    report = steps.parse_report(REPORT.format(smi=""))
    assert report is not None
    verdict = steps.judge_container(report, ["gpu-3"], {"gpu-3": "GPU-abc"}, "ns/p")
    assert verdict.ok
    assert verdict.said == "pod ns/p saw exactly gpu-3; its claim had admin access"
    smi = "GPU 0: NVIDIA H200 (UUID: GPU-abc)\n"
    real = steps.parse_report(REPORT.format(smi=smi))
    assert real is not None and real.smi_uuids == ("GPU-abc",)
    ok = steps.judge_container(
        real, ["gpu-3"], {"gpu-3": "GPU-abc"}, "ns/p", ordinary_because="no admin access: why"
    )
    assert ok.ok
    assert ok.said == (
        "pod ns/p saw exactly gpu-3, nvidia-smi -L: GPU-abc; "
        "its claim was an ordinary one (no admin access: why)"
    )


def test_the_container_saw_something_else() -> None:
    report = steps.parse_report(REPORT.format(smi="GPU 0: x (UUID: GPU-other)\n"))
    assert report is not None
    verdict = steps.judge_container(report, ["gpu-4"], {"gpu-4": "GPU-abc"}, "ns/p")
    assert not verdict.ok
    assert "CDI environment names ['gpu-3'], allocated ['gpu-4']" in verdict.said
    assert "missing ['/dev/nvidia4'], unexpected ['/dev/nvidia3']" in verdict.said
    assert "nvidia-smi -L lists ['GPU-other']" in verdict.said
    assert verdict.layer == "5. CDI in the runtime"


def test_an_incomplete_report_is_none() -> None:
    assert steps.parse_report("== env\nA=1\n== devices\n") is None


def test_a_leftover_cdi_spec_blames_unprepare() -> None:
    uid = "0b5c1a2e-1111-2222-3333-444455556666"
    left = steps.judge_cdi(f"k8s.gpu.nvidia.com-claim_{uid}.json\nother.json", uid, "/var/run/cdi")
    assert not left.ok and left.layer == "4. prepare (unprepare)"
    assert steps.judge_cdi("other.json", uid, "/var/run/cdi").ok
    assert steps.cdi_listing("== cdi\na.json\n== end\n") == "a.json"
    assert steps.cdi_listing("== cdi\n") is None


@pytest.mark.parametrize(
    ("scheduled", "event", "layer", "ordinary_because"),
    [
        ("False", ("FailedScheduling", "cannot allocate all claims"), "3. allocation", "why"),
        ("False", ("FailedScheduling", "cannot allocate all claims"), "3. allocation", None),
        ("True", ("FailedPrepareDynamicResources", "prepare failed"), "4. prepare", None),
    ],
)
def test_a_pod_that_did_not_run_names_where_it_stopped(
    scheduled: str, event: tuple[str, str], layer: str, ordinary_because: str | None
) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": scheduled}],
        },
    }
    events = [{"type": "Warning", "reason": event[0], "message": event[1]}]
    verdict = steps.judge_pending(pod, events, 30, ordinary_because=ordinary_because)
    assert not verdict.ok and verdict.layer == layer
    assert event[1] in verdict.said
    assert verdict.look.startswith("kubectl describe pod -n ns p;"), verdict.look
    free = "validate needs one free device of its class on the node: its claim was an ordinary"
    if scheduled == "False" and ordinary_because:  # every device allocated to workloads?
        assert free + " one (why)" in verdict.look
    elif scheduled == "False":  # admin access: busy devices are not the cause
        assert free not in verdict.look
        assert "a device held by workloads would do" in verdict.look


def test_the_check_claim_asks_for_admin_access_unless_told_not_to() -> None:
    admin = steps.claim("c", "gpu.nvidia.com")
    assert admin["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}}
    ]
    assert steps.admin_access_kept(admin)
    ordinary = steps.claim("c", "gpu.nvidia.com", admin_access=False)
    assert ordinary["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    ]
    assert not steps.admin_access_kept(ordinary), "what an API server without the feature returns"


# The API server's answer (Kubernetes 1.37.2) to a claim with admin access in a namespace
# without the label; tests/cluster/test_validate.py checks it against a real one.
REFUSED = (
    'ResourceClaim.resource.k8s.io "c" is invalid: spec.devices.requests[0].adminAccess: '
    "Forbidden: admin access to devices requires the `resource.kubernetes.io/admin-access: true` "
    "label on the containing namespace"
)


@pytest.mark.parametrize(
    ("status", "message", "refused"),
    [
        (422, REFUSED, True),
        (403, 'resourceclaims is forbidden: User "u" cannot create resource', False),
        (422, 'ResourceClaim.resource.k8s.io "c" is invalid: spec.devices.requests', False),
        (None, "connection refused", False),
    ],
)
def test_only_a_refusal_for_the_namespace_label_falls_back_to_an_ordinary_claim(
    status: int | None, message: str, refused: bool
) -> None:
    assert steps.admin_access_refused(status, message) is refused


class ClaimApi:
    """An API server that refuses claims with admin access (``refuse``) or drops the field
    (``drop``), and records the claims it created."""

    def __init__(self, *, refuse: bool = False, drop: bool = False) -> None:
        self.refuse, self.drop = refuse, drop
        self.created: list[dict[str, Any]] = []

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        from dra_gpu.kube import errors

        assert method == "POST" and path.endswith("/resourceclaims"), (method, path)
        asks = steps.admin_access_kept(body)
        if asks and self.refuse:
            raise errors.ApiError(REFUSED, status=422, reason="Invalid")
        if asks and self.drop:
            body = steps.claim(body["metadata"]["name"], "gpu.nvidia.com", admin_access=False)
        self.created.append(body)
        return dict(body)


@pytest.mark.parametrize(
    ("api", "because"),
    [
        (ClaimApi(), None),
        (
            ClaimApi(refuse=True),
            "no admin access: namespace gpu-ops lacks the label "
            "resource.kubernetes.io/admin-access=true; "
            "kubectl label namespace gpu-ops resource.kubernetes.io/admin-access=true",
        ),
        (ClaimApi(drop=True), steps.ADMIN_ACCESS_NOT_SERVED),
    ],
    ids=["granted", "namespace-without-label", "feature-off"],
)
def test_without_admin_access_the_claim_is_an_ordinary_one_saying_why(
    api: ClaimApi, because: str | None
) -> None:
    validation = Validation(api, Options(node="n1", namespace="gpu-ops"), say=print)  # type: ignore[arg-type]
    assert validation._create_claim(
        "/apis/resource.k8s.io/v1/namespaces/gpu-ops/resourceclaims"
    ) == (because)
    (created,) = api.created
    assert steps.admin_access_kept(created) is (because is None)


def test_the_recorded_label_and_version() -> None:
    assert steps.validated_label("gpu.nvidia.com") == "gpu.nvidia.com/validated"
    assert steps.version_of("registry.example:5000/dra-gpu:0.3.1") == "0.3.1"
    assert steps.version_of("dra-gpu@sha256:abc") == ""


class Api:
    """The API server's answers validate asks for; a missing node is a 404."""

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        from dra_gpu.kube import errors

        if path.startswith("/api/v1/nodes/"):
            raise errors.NotFound(f'nodes "{path.rsplit("/", 1)[1]}" not found')
        raise AssertionError(f"unexpected {method} {path}")


def test_a_node_that_does_not_exist_stops_at_the_first_check() -> None:
    said: list[str] = []
    outcome = Validation(Api(), Options(node="ghost"), say=said.append).run()  # type: ignore[arg-type]
    assert not outcome.ok
    assert (
        said[0] == "FAIL  node: node ghost does not exist "
        "[layer 0. the cluster, docs/user/troubleshooting.md; look at: kubectl get nodes]"
    )
    assert said[1:] == ["SKIP  plugin", "SKIP  slices", "SKIP  pod", "SKIP  cdi"]


@pytest.mark.parametrize(
    ("status", "message", "pending"),
    [
        (
            403,
            'pods "dra-gpu-validate-8ad3a5" is forbidden: error looking up service account '
            'gpu-demo/default: serviceaccount "default" not found',
            True,
        ),
        (403, 'pods "x" is forbidden: violates PodSecurity "restricted:latest"', False),
        (404, 'namespaces "gpu-demo" not found', False),
        (None, "connection refused", False),
    ],
)
def test_a_pod_refused_for_a_service_account_not_made_yet_is_tried_again(
    status: int | None, message: str, pending: bool
) -> None:
    assert steps.service_account_pending(status, message) is pending
