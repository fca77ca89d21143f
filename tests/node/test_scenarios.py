"""Every scenario of ``e2e/scenarios/`` on the real local nodes: each pod sees exactly its devices.

The same scenarios run against any cluster with ``python -m e2e.suite`` (e.g. kind, see
``e2e/kind/``); here they also verify CDI specs appear on the node and disappear on delete.
"""

from __future__ import annotations

import pytest

from e2e.suite import needs
from e2e.suite.runner import Context, Scenario, run_scenario
from e2e.suite.scenarios import SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(suite: Context, scenario: Scenario) -> None:
    try:
        run_scenario(suite, scenario)
    except needs.Refused as refused:  # this Kubernetes version lacks the feature: say which
        pytest.skip(f"refused: {refused}")
