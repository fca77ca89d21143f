"""The chart as e2e/kind/run.sh installs it: one release per simulated profile, side by side.

`make kind-e2e` runs the kit (minutes, outside `make test`); this quick check renders each
release with exactly the values the script passes (parsed from the script) and has the local API
server accept both releases together.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from e2e import helm
from e2e.cluster import Cluster

SCRIPT = Path(__file__).resolve().parent.parent.parent / "e2e" / "kind" / "run.sh"
SCRIPT_DEFAULTS = {"IMAGE_REPOSITORY": "dra-gpu", "IMAGE_TAG": "e2e"}


def script_releases() -> list[tuple[str, str]]:
    return re.findall(r"^install_driver (\S+) (\S+)$", SCRIPT.read_text(), re.MULTILINE)


def script_values(profile: str) -> dict[str, str | bool]:
    """The ``--set`` values of the script's install_driver, with its variables substituted."""
    text = SCRIPT.read_text()
    body = text[
        text.index("install_driver() {") : text.index("\n}\n", text.index("install_driver"))
    ]
    variables = {**SCRIPT_DEFAULTS, "profile": profile}
    values: dict[str, str | bool] = {}
    for raw in re.findall(r"--set(?:-string)? (\S+)", body):
        key, _, value = raw.replace('"', "").partition("=")
        value = re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], value)
        values[key] = {"true": True, "false": False}.get(value, value)
    return values


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_each_release_runs_its_plugin_only_on_its_profiles_worker() -> None:
    for release, profile in script_releases():
        docs = _docs(
            helm.render(release=release, namespace=release, set_values=script_values(profile))
        )
        (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
        pod = daemonset["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"dra-gpu.test/profile": profile}
        assert pod["containers"][0]["image"] == "dra-gpu:e2e"
        assert pod["containers"][0]["imagePullPolicy"] == "Never"
        assert profile in yaml.safe_dump(pod["containers"][0].get("env", []))


def test_api_server_accepts_both_releases_side_by_side(cluster: Cluster) -> None:
    rendered = []
    for release, profile in script_releases():
        cluster.kubectl("create", "namespace", release, check=False)
        rendered.append(
            helm.render(release=release, namespace=release, set_values=script_values(profile))
        )
    documents = "\n---\n".join(rendered)
    applied = cluster.server_dry_run(documents, field_manager="kind-e2e")
    assert len(applied) == len(_docs(documents)), applied
