"""A real kubelet accepts the plugin: it finds the registration socket, validates GetInfo, and
confirms with NotifyRegistrationStatus(plugin_registered=true).

Cases: every real node's plugin logs the kubelet's confirmation and no refusal.
"""

from __future__ import annotations

from typing import Any

import pytest

from e2e.waiting import WaitTimeout, wait_for

WAIT_S = 60.0


def test_kubelet_confirms_registration_of_every_plugin(driver: Any) -> None:
    plugins = driver.plugins  # conftest.Driver: node name -> PluginProcess
    pending = dict(plugins)

    def all_confirmed() -> bool:
        for name, plugin in list(pending.items()):
            log = plugin.log_path.read_text(errors="replace")
            assert "REFUSED" not in log, f"{name}: the kubelet refused the plugin:\n{log[-2000:]}"
            if "registered with the kubelet" in log:
                del pending[name]
        return not pending

    try:
        wait_for("the kubelet to confirm every plugin", all_confirmed, timeout=WAIT_S, every=0.5)
    except WaitTimeout:
        tails = "\n".join(f"--- {n} ---\n{p.log_tail()}" for n, p in pending.items())
        pytest.fail(f"no registration confirmed by the kubelet for {sorted(pending)}:\n{tails}")
