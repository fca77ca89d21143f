"""``dra-gpu discover -o json`` against the real API server (server-side dry-run).

Cases: for every built-in simulated profile the exact JSON the command prints (a v1 List of
ResourceSlices, here with an ownerReference to a registered Node as the plugin publishes them)
is accepted by the API server's validation; what the server would store has the same devices,
attributes and capacities (our quantities are already canonical, so a published slice compares
equal to the one read back); a slice over the API's limits is refused, so the dry-run really
validates.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import dra_gpu
from dra_gpu import discover_cmd
from dra_gpu.devices import naming, simulated
from dra_gpu.plugin import published
from e2e.cluster import Cluster, ClusterError

NODE = "discovery-dry-run-node"


def profile_slices(profile: str, node_uid: str | None) -> list[dict[str, Any]]:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES[profile], node_name=NODE
    )
    devices = naming.build_devices(backend.discover().gpus)
    return published.node_slices(
        devices,
        driver_name=dra_gpu.DRIVER_NAME,
        node_name=NODE,
        node_uid=node_uid,
        pool_generation=published.FIRST_GENERATION,
    )


def dry_run(cluster: Cluster, doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(doc)
    )
    parsed = json.loads(out)
    items: list[dict[str, Any]] = parsed["items"] if parsed.get("kind") == "List" else [parsed]
    return items


@pytest.fixture(scope="module")
def node_uid(cluster: Cluster) -> str:
    return str(cluster.register_node(NODE)["metadata"]["uid"])


@pytest.mark.parametrize("profile", sorted(simulated.BUILTIN_PROFILES))
def test_cli_json_is_accepted_as_is(
    cluster: Cluster, profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = discover_cmd.main(["--simulate", profile, "--node-name", NODE, "-o", "json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    stored = dry_run(cluster, doc)
    assert [s["metadata"]["name"] for s in stored] == [s["metadata"]["name"] for s in doc["items"]]


@pytest.mark.parametrize("profile", sorted(simulated.BUILTIN_PROFILES))
def test_server_keeps_devices_unchanged(cluster: Cluster, node_uid: str, profile: str) -> None:
    ours = profile_slices(profile, node_uid)
    stored = dry_run(cluster, {"apiVersion": "v1", "kind": "List", "items": ours})
    for mine, theirs in zip(ours, stored, strict=True):
        assert theirs["metadata"]["ownerReferences"][0]["uid"] == node_uid
        assert theirs["spec"]["pool"] == mine["spec"]["pool"]
        got = {
            d["name"]: (d.get("attributes"), d.get("capacity"))
            for d in theirs["spec"].get("devices") or []  # an empty list is not stored
        }
        want = {d["name"]: (d["attributes"], d["capacity"]) for d in mine["spec"]["devices"]}
        assert got == want


def test_dry_run_really_validates(cluster: Cluster) -> None:
    (obj,) = profile_slices("h200x8", None)
    obj["spec"]["devices"][0]["attributes"]["productName"] = {"string": "x" * 65}
    with pytest.raises(ClusterError, match="64"):
        dry_run(cluster, obj)
