"""The controller as real processes against the real API server, which calls its webhook over TLS.

Two replicas (``ctl-a`` started first, so it leads; ``ctl-b`` follows), both serving the webhook
with one self-signed CA from a shared cert dir. A ValidatingWebhookConfiguration limited to this
module's namespace points the API server at ``ctl-a``'s port on 127.0.0.1, failurePolicy Fail.

Cases:
- A claim asking more memory than any published GPU (an H200 slice) has is refused naming the
  most there is; one asking less is created.
- A claim with an invalid GpuConfig is refused with the field named; a valid one is created; a
  template with an invalid config is refused; a misspelled selector attribute is created with a
  warning suggesting the published name; a DeviceClass with an invalid GpuConfig is refused.
- A claim nested 985 or 1,600 levels deep, and one with a quantity exponent of 99,999,999, are
  refused by the webhook with a reason (they used to drop the connection: `EOF`).
- The built-in DeviceClasses are restored after deletion and after an edit; a class the
  controller does not own is never touched; the classes file's classes appear, and follow edits
  of the file (added, removed, extendedResourceName set on gpu.nvidia.com).
- An API server outage longer than the renew deadline: both replicas survive, the leader stands
  down, one of them leads again afterwards and restores a deleted class.
- Only the Lease holder acts; after SIGTERM the other replica takes the Lease and acts, and its
  own webhook serves the same answers.

Teardown removes the webhook configuration, stops both processes, and puts DeviceClasses back
as they were before this module.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dra_gpu.controller import classes, registration
from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient, connect
from dra_gpu.plugin import inventory, platforms
from dra_gpu.plugin.published import node_slices
from e2e import helm, probes, procs, waiting
from e2e.cluster import Cluster

NS = "dra-gpu-controller-test"
LEASE = "dra-gpu-controller-test"
WEBHOOK_CONFIG = "dra-gpu-controller-test"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
TEMPLATES = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
DENIED = f'admission webhook "{registration.WEBHOOK_NAME}" denied the request'
CLASS_DENIED = f'admission webhook "{registration.CLASSES_WEBHOOK_NAME}" denied the request'
# Only DeviceClasses with this label reach this module's webhook (the cluster is shared).
CLASS_LABEL = "dra-gpu.test/controller-webhook"

CLASSES_FILE = """
classes:
  - name: h200.nvidia.com
    productName: NVIDIA H200
  - name: big.nvidia.com
    minMemory: 80Gi
"""
CLASSES_FILE_EDITED = """
extendedResourceName: nvidia.com/gpu
classes:
  - name: h200.nvidia.com
    productName: NVIDIA H200
  - name: small-mig.nvidia.com
    deviceType: mig
    selectors: ["device.attributes['gpu.nvidia.com'].profile == '1g.18gb'"]
"""

T = TypeVar("T")
WAIT_S = 60.0  # bounds a broken controller only


def wait_for(check: Callable[[], T | None], *, what: str) -> T:
    """Poll ``check``; an API error (a replica restarting, an outage) only means "not yet"."""
    return waiting.wait_for(what, check, timeout=WAIT_S, retry_on=(errors.ApiError,))


@dataclass
class Replica:
    identity: str
    port: int
    log_path: Path
    proc: Any  # subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def actions(self) -> list[str]:
        """The DeviceClass writes this replica logged."""
        marks = (" created: ", " updated: ", " deleted: ")
        return [
            ln
            for ln in self.log().splitlines()
            if "DeviceClass " in ln and any(m in ln for m in marks)
        ]


@dataclass
class Setup:
    client: KubeClient
    a: Replica
    b: Replica
    ca: Path
    classes_file: Path


def start_replica(
    cluster: Cluster, workdir: Path, identity: str, port: int, classes_file: Path
) -> Replica:
    log_path = workdir / f"{identity}.log"
    argv = [
        *(sys.executable, "-m", "dra_gpu", "controller"),
        *("--kubeconfig", str(cluster.kubeconfig), "--config", str(classes_file)),
        *("--webhook-port", str(port), "--webhook-address", "127.0.0.1"),
        *("--cert-dir", str(workdir / "certs")),
        *("--lease-namespace", NS, "--lease-name", LEASE, "--identity", identity),
        *("--resync-period", "10"),
    ]
    proc = procs.spawn(argv, log_path=log_path, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return Replica(identity, port, log_path, proc)


def healthy(replica: Replica, ca: Path) -> bool:
    return probes.https_healthy(replica.port, ca)


def lease_holder(client: KubeClient) -> str:
    return str(client.request("GET", LEASE_PATH)["spec"].get("holderIdentity") or "")


def gpu_config(**sharing: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
    if sharing:
        params["sharing"] = sharing
    return params


def claim(
    name: str, *, params: dict[str, Any] | None = None, selectors: list[str] | None = None
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if params is not None:
        devices["config"] = [
            {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": devices},
    }


def register_webhook(client: KubeClient, port: int, ca: Path) -> None:
    config = helm.webhook_configuration(
        WEBHOOK_CONFIG,
        registration.client_config_url(
            f"https://127.0.0.1:{port}/validate", ca_bundle_pem=ca.read_bytes()
        ),
        namespaces=[NS],
        class_selector={"matchLabels": {CLASS_LABEL: "true"}},
    )
    try:
        existing = client.request("GET", f"{WEBHOOKS}/{WEBHOOK_CONFIG}")
        config["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        client.request("PUT", f"{WEBHOOKS}/{WEBHOOK_CONFIG}", body=config)
    except errors.NotFound:
        client.request("POST", WEBHOOKS, body=config)


def webhook_refuses(client: KubeClient) -> bool:
    """True once a dry-run of a bad claim is refused by the webhook now configured."""
    bad = claim("probe", params=gpu_config(strategy="Sometimes"))
    try:
        client.call("POST", CLAIMS, query={"dryRun": "All"}, body=bad)
    except errors.ApiError as exc:
        return DENIED in exc.message
    return False


def restore_classes(client: KubeClient, before: list[dict[str, Any]]) -> None:
    for obj in client.request("GET", CLASSES).get("items") or []:
        if classes.is_owned(obj):
            client.request("DELETE", f"{CLASSES}/{obj['metadata']['name']}")
    for obj in before:
        meta = {
            k: obj["metadata"][k] for k in ("name", "labels", "annotations") if k in obj["metadata"]
        }
        with contextlib.suppress(errors.AlreadyExists):
            client.request("POST", CLASSES, body={**obj, "metadata": meta})


@pytest.fixture(scope="module")
def setup(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("controller")
    client = connect(cluster.kubeconfig)
    cluster.create_namespace(NS)
    before = client.request("GET", CLASSES).get("items") or []
    for obj in before:  # someone else's built-in classes would be left alone: move them away
        if obj["metadata"]["name"] in classes.BUILTIN_NAMES and not classes.is_owned(obj):
            client.request("DELETE", f"{CLASSES}/{obj['metadata']['name']}")
    classes_file = workdir / "classes.yaml"
    classes_file.write_text(CLASSES_FILE)
    port_a, port_b = procs.free_ports(2)
    ca = workdir / "certs" / "ca.crt"
    a = start_replica(cluster, workdir, "ctl-a", port_a, classes_file)
    replicas = [a]
    try:
        wait_for(lambda: healthy(a, ca), what="ctl-a's webhook")
        wait_for(lambda: lease_holder(client) == "ctl-a", what="ctl-a to hold the lease")
        b = start_replica(cluster, workdir, "ctl-b", port_b, classes_file)
        replicas.append(b)
        wait_for(lambda: healthy(b, ca), what="ctl-b's webhook")
        register_webhook(client, port_a, ca)
        wait_for(lambda: webhook_refuses(client), what="the webhook to be in effect")
        yield Setup(client, a, b, ca, classes_file)
    finally:
        try:
            with contextlib.suppress(errors.NotFound):
                client.request("DELETE", f"{WEBHOOKS}/{WEBHOOK_CONFIG}")
        finally:
            procs.stop_many([r.proc for r in replicas], grace_s=10)
            restore_classes(client, before)
            client.close()


def get_class(client: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        return client.request("GET", f"{CLASSES}/{name}")
    except errors.NotFound:
        return None


def builtin_spec(name: str) -> dict[str, Any]:
    (want,) = [d for d in classes.builtin_classes(extended_resource_name=None) if d.name == name]
    return dict(want.spec)


# ----- admission -----------------------------------------------------------------------------


def test_invalid_gpu_config_is_refused_naming_the_field(setup: Setup) -> None:
    bad = claim("bad-strategy", params=gpu_config(strategy="Sometimes"))
    with pytest.raises(errors.ApiError) as refused:
        setup.client.call("POST", CLAIMS, body=bad)
    assert DENIED in refused.value.message
    assert "spec.devices.config[0].opaque.parameters.sharing.strategy" in refused.value.message
    with pytest.raises(errors.NotFound):
        setup.client.request("GET", f"{CLAIMS}/bad-strategy")


def test_unknown_field_is_refused(setup: Setup) -> None:
    bad = claim("bad-field", params={**gpu_config(), "sharng": {"strategy": "MPS"}})
    with pytest.raises(errors.ApiError) as refused:
        setup.client.call("POST", CLAIMS, body=bad)
    assert "spec.devices.config[0].opaque.parameters.sharng: unknown field" in refused.value.message


def test_valid_claim_is_created_without_warnings(setup: Setup) -> None:
    good = claim(
        "good", params=gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"})
    )
    reply = setup.client.call("POST", CLAIMS, body=good)
    assert reply.body["metadata"]["name"] == "good"
    assert reply.warnings == ()


def test_template_with_invalid_config_is_refused(setup: Setup) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bad-template", "namespace": NS},
        "spec": {"spec": claim("x", params={**gpu_config(), "kind": "TpuConfig"})["spec"]},
    }
    with pytest.raises(errors.ApiError) as refused:
        setup.client.call("POST", TEMPLATES, body=template)
    assert "spec.spec.devices.config[0].opaque.parameters.kind" in refused.value.message


def test_misspelled_selector_is_created_with_a_warning(setup: Setup) -> None:
    typo = claim("typo", selectors=["device.attributes['gpu.nvidia.com'].productname == 'X'"])
    reply = setup.client.call("POST", CLAIMS, body=typo)
    assert reply.body["metadata"]["name"] == "typo"
    assert any(
        "spec.devices.requests[0].exactly.selectors[0]" in w and "'productName'" in w
        for w in reply.warnings
    ), reply.warnings


def test_a_request_no_published_gpu_can_meet_is_refused(setup: Setup) -> None:
    slice_path = "/apis/resource.k8s.io/v1/resourceslices"
    node = "webhook-capacity-node"
    (published,) = node_slices(
        list(
            inventory.discover(
                inventory.backend_for(platforms.for_node(simulate="h200x8", node_name=node))
            )
        )[:1],
        driver_name="gpu.nvidia.com",
        node_name=node,
        node_uid=None,
        pool_generation=1,
    )
    setup.client.request("POST", slice_path, body=published)
    try:

        def asking(name: str, memory: str) -> dict[str, Any]:
            body = claim(name)
            body["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
                "requests": {"memory": memory}
            }
            return body

        def refused() -> str | None:
            try:
                setup.client.call("POST", CLAIMS, body=asking("too-big", "200Gi"))
            except errors.ApiError as exc:
                return exc.message
            setup.client.request("DELETE", f"{CLAIMS}/too-big")
            return None  # the webhook's list may be up to 30 s older than the slice

        message = waiting.wait_for("the 200Gi request refused", refused, timeout=60)
        # A claim without a config of the driver goes to the Ignore webhook.
        assert 'admission webhook "selectors.gpu.nvidia.com" denied the request' in message
        assert (
            "spec.devices.requests[0].exactly.capacity.requests.memory: asks 200Gi, the most any "
            "published device of class gpu.nvidia.com has is 143771Mi" in message
        ), message
        reply = setup.client.call("POST", CLAIMS, body=asking("fits", "140Gi"))
        assert reply.body["metadata"]["name"] == "fits"
    finally:
        setup.client.request("DELETE", f"{slice_path}/{published['metadata']['name']}")


def test_device_class_with_invalid_config_is_refused(setup: Setup) -> None:
    bad: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "ctl-test-bad-class", "labels": {CLASS_LABEL: "true"}},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
            "config": [
                {"opaque": {"driver": "gpu.nvidia.com", "parameters": gpu_config(strategy="x")}}
            ],
        },
    }
    with pytest.raises(errors.ApiError) as refused:
        setup.client.call("POST", CLASSES, body=bad, query={"dryRun": "All"})
    assert CLASS_DENIED in refused.value.message
    assert "spec.config[0].opaque.parameters.sharing.strategy" in refused.value.message
    bad["spec"]["config"][0]["opaque"]["parameters"] = gpu_config(strategy="TimeSlicing")
    reply = setup.client.call("POST", CLASSES, body=bad, query={"dryRun": "All"})
    assert reply.body["metadata"]["name"] == "ctl-test-bad-class"


@pytest.mark.parametrize("depth", [985, 1600])
def test_deeply_nested_config_is_refused_saying_so(
    cluster: Cluster, setup: Setup, depth: int
) -> None:
    """Was a dropped connection: the API server answered 500 `failed calling webhook: EOF`."""
    import json

    from e2e.cluster import ClusterError

    deep = claim("deep", params={**gpu_config(), "sharing": "DEEP"})
    # Python's json recursion stops near 1,000 levels: the deep part is written as text, compact
    # (the API server allows 10,240 bytes of parameters).
    text = json.dumps(deep).replace('"DEEP"', '{"a":' * depth + "1" + "}" * depth)
    with pytest.raises(ClusterError) as refused:
        cluster.kubectl("create", "--dry-run=server", "-f", "-", input=text)
    assert DENIED in str(refused.value)
    assert "nested more than 64 levels deep" in str(refused.value)
    assert "EOF" not in str(refused.value)


def test_huge_quantity_exponent_gets_an_answer(setup: Setup) -> None:
    huge = claim(
        "huge",
        params=gpu_config(
            strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "1e99999999"}
        ),
    )
    with pytest.raises(errors.ApiError) as refused:
        setup.client.call("POST", CLAIMS, body=huge, query={"dryRun": "All"})
    assert DENIED in refused.value.message
    assert "EOF" not in refused.value.message


# ----- DeviceClasses ------------------------------------------------------------------------


def test_builtin_classes_exist_with_label(setup: Setup) -> None:
    for name in classes.BUILTIN_NAMES:
        obj = wait_for(functools.partial(get_class, setup.client, name), what=name)
        assert classes.is_owned(obj)
        assert obj["spec"]["selectors"] == builtin_spec(name)["selectors"]


def test_deleted_class_is_restored(setup: Setup) -> None:
    old_uid = wait_for(lambda: get_class(setup.client, "gpu.nvidia.com"), what="class")["metadata"][
        "uid"
    ]
    setup.client.request("DELETE", f"{CLASSES}/gpu.nvidia.com")
    back = wait_for(
        lambda: (
            (o := get_class(setup.client, "gpu.nvidia.com"))
            and o["metadata"]["uid"] != old_uid
            and o
        ),
        what="gpu.nvidia.com to be recreated",
    )
    assert back["spec"]["selectors"] == builtin_spec("gpu.nvidia.com")["selectors"]


def test_edited_class_is_restored(setup: Setup) -> None:
    obj = wait_for(lambda: get_class(setup.client, "mig.nvidia.com"), what="class")
    obj["spec"]["selectors"] = [{"cel": {"expression": "true"}}]
    setup.client.request("PUT", f"{CLASSES}/mig.nvidia.com", body=obj)
    wait_for(
        lambda: (
            (o := get_class(setup.client, "mig.nvidia.com"))
            and o["spec"]["selectors"] == builtin_spec("mig.nvidia.com")["selectors"]
        ),
        what="mig.nvidia.com's selectors to be restored",
    )


def expressions(obj: dict[str, Any]) -> list[str]:
    return [s["cel"]["expression"] for s in obj["spec"]["selectors"]]


def test_classes_file_is_applied_and_followed(setup: Setup) -> None:
    foreign = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "someone-else.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "true"}}]},
    }
    foreign_rv = setup.client.request("POST", CLASSES, body=foreign)["metadata"]["resourceVersion"]
    h200 = wait_for(lambda: get_class(setup.client, "h200.nvidia.com"), what="h200 class")
    assert expressions(h200) == [
        classes.type_selector("gpu"),
        "device.attributes['gpu.nvidia.com'].productName == \"NVIDIA H200\"",
    ]
    big = wait_for(lambda: get_class(setup.client, "big.nvidia.com"), what="big class")
    assert 'quantity("80Gi")' in expressions(big)[1]

    setup.classes_file.write_text(CLASSES_FILE_EDITED)
    wait_for(lambda: get_class(setup.client, "small-mig.nvidia.com"), what="the added class")
    wait_for(lambda: get_class(setup.client, "big.nvidia.com") is None, what="removal of big")
    wait_for(
        lambda: (
            (get_class(setup.client, "gpu.nvidia.com") or {})["spec"].get("extendedResourceName")
            == "nvidia.com/gpu"
        ),
        what="gpu.nvidia.com to get the file's extendedResourceName",
    )
    still = get_class(setup.client, "someone-else.example.com")
    assert still is not None and still["metadata"]["resourceVersion"] == foreign_rv
    setup.client.request("DELETE", f"{CLASSES}/someone-else.example.com")


# ----- leader election (last: it stops ctl-a) ---------------------------------------------


def recreate_and_wait(client: KubeClient, name: str) -> None:
    client.request("DELETE", f"{CLASSES}/{name}")
    wait_for(lambda: get_class(client, name), what=f"{name} to be recreated")


def leader_and_follower(setup: Setup) -> tuple[Replica, Replica]:
    holder = lease_holder(setup.client)
    assert holder in ("ctl-a", "ctl-b")
    return (setup.a, setup.b) if holder == "ctl-a" else (setup.b, setup.a)


def active_leader(client: KubeClient) -> str:
    """The holder once it has renewed the Lease while we watched (not a stale record)."""
    first = client.request("GET", LEASE_PATH)["spec"]
    time.sleep(0.5)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        spec = client.request("GET", LEASE_PATH)["spec"]
        if spec.get("renewTime") != first.get("renewTime"):
            return str(spec.get("holderIdentity") or "")
        time.sleep(0.5)
    return ""


def test_survives_an_api_server_outage(setup: Setup, cluster: Cluster) -> None:
    cluster.stop_apiserver()
    time.sleep(12)  # past the renew deadline: the leader must stand down, not crash
    cluster.start_apiserver()
    assert setup.a.proc.poll() is None and setup.b.proc.poll() is None
    wait_for(lambda: active_leader(setup.client), what="a renewing lease holder after the outage")
    recreate_and_wait(setup.client, "gpu.nvidia.com")
    lines = (setup.a.log() + setup.b.log()).splitlines()
    assert any("stopped leading" in ln for ln in lines)


def test_only_the_leader_acts_and_the_other_takes_over(setup: Setup) -> None:
    client = setup.client
    leader, follower = leader_and_follower(setup)
    transitions = client.request("GET", LEASE_PATH)["spec"].get("leaseTransitions", 0)
    leader_before, follower_before = len(leader.actions()), len(follower.actions())
    recreate_and_wait(client, "mig.nvidia.com")
    # The class is visible before the replica logs its write: wait for the line, not the object.
    wait_for(lambda: len(leader.actions()) > leader_before, what="the leader's log line")
    assert "DeviceClass mig.nvidia.com created" in leader.actions()[leader_before]
    assert len(follower.actions()) == follower_before

    procs.stop(leader.proc, grace_s=10)
    assert leader.proc.returncode == 0, leader.log()[-2000:]
    assert "released the lease" in leader.log()
    wait_for(lambda: lease_holder(client) == follower.identity, what="the follower to take over")
    assert client.request("GET", LEASE_PATH)["spec"]["leaseTransitions"] == transitions + 1
    recreate_and_wait(client, "mig.nvidia.com")
    wait_for(lambda: len(follower.actions()) > follower_before, what="the new leader's log line")
    # Its takeover pass found every other class as it wants it: no rewrites, one recreation.
    (action,) = follower.actions()[follower_before:]
    assert "DeviceClass mig.nvidia.com created" in action

    # Every replica serves the webhook: point the API server at the survivor's.
    register_webhook(client, follower.port, setup.ca)
    wait_for(lambda: webhook_refuses(client), what="the survivor's webhook")
    with pytest.raises(errors.ApiError) as refused:
        client.call("POST", CLAIMS, body=claim("after", params=gpu_config(strategy="Nope")))
    assert DENIED in refused.value.message
