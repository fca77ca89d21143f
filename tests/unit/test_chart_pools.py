"""The chart's GPU node pools (``kubeletPlugin.pools``), rendered with helm.

Cases: without pools the chart renders its one plugin DaemonSet, unlabelled by pool; with two
pools, one DaemonSet each, named after the pool, on the pool's nodes (its nodeSelector over the
chart's), with the pool's image tag, tolerations and plugin settings over the chart's (a pool can
turn a setting the chart turns on off again), the rest inherited, and every environment the plugin
gets accepted by the plugin's own settings parser; the pools' pods are told apart by label and
share the plugin's service account (its RBAC and admission policies). Bad input fails the render
and names what is wrong: an unknown setting (at the top of a pool, in its sharing, in its image),
a pool without a nodeSelector, a name that is no DNS label or is used twice, a bad MIG mode.

helm is built on first use (``e2e.helm.ensure_helm``), as the cluster tier's chart tests do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.plugin import settings as plugin_settings
from e2e import helm

POOL_LABEL = "dra-gpu/pool"
TWO_POOLS: dict[str, Any] = {
    "image": {"tag": "1.0"},
    "kubeletPlugin": {
        "sharing": {"mps": True},
        "pools": [
            {
                "name": "canary",
                "nodeSelector": {"dra-gpu.test/pool": "canary"},
                "image": {"tag": "1.1"},
                "sharing": {"consumableShares": "memory", "mps": False},
                "migMode": "dynamic",
            },
            {
                "name": "h200",
                "nodeSelector": {"node.kubernetes.io/instance-type": "p5e.48xlarge"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
                "logLevel": "DEBUG",
            },
        ],
    },
}


@pytest.fixture(scope="module", autouse=True)
def helm_binary() -> Iterator[Path]:
    yield helm.ensure_helm()


def render(tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return [d for d in yaml.safe_load_all(helm.render(values_files=[path])) if d]


def daemonsets(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}


def plugin_env(ds: dict[str, Any]) -> dict[str, str]:
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in ctr["env"] if "value" in e}


def render_error(tmp_path: Path, values: dict[str, Any]) -> str:
    with pytest.raises(RuntimeError) as failed:
        render(tmp_path, values)
    return str(failed.value)


def one_pool(**settings: Any) -> dict[str, Any]:
    pool = {"name": "a", "nodeSelector": {"pool": "a"}, **settings}
    return {"kubeletPlugin": {"pools": [pool]}}


def test_without_pools_one_daemonset_as_before(tmp_path: Path) -> None:
    (ds,) = daemonsets(render(tmp_path, {})).values()
    assert ds["metadata"]["name"] == "dra-gpu-kubelet-plugin"
    assert POOL_LABEL not in ds["spec"]["selector"]["matchLabels"]
    assert "nodeSelector" not in ds["spec"]["template"]["spec"]


def test_two_pools_render_a_daemonset_each_with_its_settings(tmp_path: Path) -> None:
    found = daemonsets(render(tmp_path, TWO_POOLS))
    assert sorted(found) == ["dra-gpu-kubelet-plugin-canary", "dra-gpu-kubelet-plugin-h200"]
    canary, h200 = found["dra-gpu-kubelet-plugin-canary"], found["dra-gpu-kubelet-plugin-h200"]
    for ds, pool in ((canary, "canary"), (h200, "h200")):
        assert ds["spec"]["selector"]["matchLabels"][POOL_LABEL] == pool
        assert ds["spec"]["template"]["metadata"]["labels"][POOL_LABEL] == pool
        assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "dra-gpu-kubelet-plugin"
    pod = {name: ds["spec"]["template"]["spec"] for name, ds in found.items()}
    assert pod["dra-gpu-kubelet-plugin-canary"]["nodeSelector"] == {"dra-gpu.test/pool": "canary"}
    assert pod["dra-gpu-kubelet-plugin-h200"]["containers"][0]["image"] == "dra-gpu:1.0"
    assert pod["dra-gpu-kubelet-plugin-canary"]["containers"][0]["image"] == "dra-gpu:1.1"
    # The chart's toleration where the pool sets none; the pool's own list replaces it.
    assert [t["key"] for t in pod["dra-gpu-kubelet-plugin-canary"]["tolerations"]] == [
        "nvidia.com/gpu"
    ]
    assert [t["key"] for t in pod["dra-gpu-kubelet-plugin-h200"]["tolerations"]] == ["dedicated"]

    env = plugin_env(canary)
    assert (env["MIG_MODE"], env["CONSUMABLE_SHARES"], env["LOG_LEVEL"]) == (
        "dynamic",
        "memory",
        "INFO",
    )
    assert "MPS_SUPPORT" not in env  # the pool turned off what the chart's values turn on
    env = plugin_env(h200)
    assert (env["MPS_SUPPORT"], env["LOG_LEVEL"]) == ("true", "DEBUG")
    assert "MIG_MODE" not in env and "CONSUMABLE_SHARES" not in env
    for ds in found.values():  # what each pool's plugin starts with
        fields = {"NODE_NAME": "n", "POD_UID": "u1"}
        settings = plugin_settings.build_settings({}, {**plugin_env(ds), **fields})
        assert settings.rolling_update
    canary_settings = plugin_settings.build_settings({}, {**plugin_env(canary), "NODE_NAME": "n"})
    assert canary_settings.mig_mode == "dynamic" and not canary_settings.mps_support


def test_a_pool_that_runs_gfd_turns_the_node_labels_off(tmp_path: Path) -> None:
    values = {
        "kubeletPlugin": {
            "pools": [
                {"name": "gfd", "nodeSelector": {"pool": "gfd"}, "nodeLabels": {"enabled": False}},
                {"name": "plain", "nodeSelector": {"pool": "plain"}},
            ]
        }
    }
    found = daemonsets(render(tmp_path, values))
    gfd = plugin_env(found["dra-gpu-kubelet-plugin-gfd"])
    plain = plugin_env(found["dra-gpu-kubelet-plugin-plain"])
    assert (gfd["NODE_LABELS"], plain["NODE_LABELS"]) == ("false", "true")
    fields = {"NODE_NAME": "n", "POD_UID": "u1"}
    assert not plugin_settings.build_settings({}, {**gfd, **fields}).node_labels
    assert plugin_settings.build_settings({}, {**plain, **fields}).node_labels


def test_a_pool_narrows_the_simulated_nodes(tmp_path: Path) -> None:
    values = {"simulate": {"enabled": True, "nodeSelector": {"sim": "yes"}}, **one_pool()}
    (ds,) = daemonsets(render(tmp_path, values)).values()
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"sim": "yes", "pool": "a"}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"migmode": "dynamic"}, 'kubeletPlugin.pools[0] (a): unknown setting "migmode"'),
        ({"sharing": {"mpss": True}}, 'kubeletPlugin.pools[0] (a): unknown setting "sharing.mpss"'),
        (
            {"image": {"repository": "x"}},
            'kubeletPlugin.pools[0] (a): unknown setting "image.repository"',
        ),
        ({"kubeletDir": "/x"}, 'kubeletPlugin.pools[0] (a): unknown setting "kubeletDir"'),
    ],
)
def test_an_unknown_setting_fails_the_render_naming_it(
    tmp_path: Path, settings: dict[str, Any], message: str
) -> None:
    assert message in render_error(tmp_path, one_pool(**settings))


def test_the_error_lists_what_a_pool_may_set(tmp_path: Path) -> None:
    error = render_error(tmp_path, one_pool(typo=1))
    assert "a pool may set name, nodeSelector, tolerations, image, affinity, sharing" in error


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        ([{"name": "a"}], "kubeletPlugin.pools[0] (a): nodeSelector is required"),
        ([{"name": "A_b", "nodeSelector": {"x": "y"}}], "name must be a DNS label"),
        ([{"nodeSelector": {"x": "y"}}], "kubeletPlugin.pools[0]: name must be a DNS label"),
        (
            [{"name": "a", "nodeSelector": {"x": "1"}}, {"name": "a", "nodeSelector": {"x": "2"}}],
            "kubeletPlugin.pools[1] (a): another pool has the same name",
        ),
        (
            [{"name": "a", "nodeSelector": {"x": "y"}, "migMode": "Dynamic"}],
            'kubeletPlugin.pools[0].migMode must be static or dynamic, not "Dynamic"',
        ),
        (
            [{"name": "a", "nodeSelector": {"x": "y"}, "sharing": {"consumableShares": "half"}}],
            "kubeletPlugin.pools[0].sharing.consumableShares must be memory",
        ),
    ],
)
def test_a_bad_pool_fails_the_render_saying_why(
    tmp_path: Path, pools: list[dict[str, Any]], message: str
) -> None:
    assert message in render_error(tmp_path, {"kubeletPlugin": {"pools": pools}})
