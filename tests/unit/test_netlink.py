"""Node networking without the ``ip`` command (GPU machines lack it): a bridge holding a /32
address, visible among the host's addresses, removed again; a refusal is an errno, not silence.

Needs root (CAP_NET_ADMIN), as the real-node tier does.
"""

from __future__ import annotations

import errno
import os
import uuid

import pytest

from e2e.node import cleanup as node_cleanup
from e2e.node import netlink

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creating interfaces needs root")


def test_a_node_address_link_is_made_and_removed_without_the_ip_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no `ip` to fall back on
    name = "dgtest" + uuid.uuid4().hex[:8]
    address = "198.18.250.77"
    try:
        node_cleanup.add_address_link(name, address)
        assert address in node_cleanup.host_addresses()
        with pytest.raises(OSError) as refused:
            netlink.add_bridge(name)
        assert refused.value.errno == errno.EEXIST
    finally:
        node_cleanup.delete_link(name)
    assert address not in node_cleanup.host_addresses()
    assert netlink.delete_link(name) is False
