"""Teardown finds exactly the node's own mounts, deepest first."""

from __future__ import annotations

from pathlib import Path

from e2e.node.cleanup import mounts_under

MOUNTINFO = """\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 22 0:40 / /tmp/node rw - tmpfs tmpfs rw
31 30 0:41 / /tmp/node/kubelet/pods/a/volumes/x rw - tmpfs tmpfs rw
32 30 0:42 / /tmp/node/containerd/state/netns/cni-1 rw - nsfs nsfs rw
33 22 0:43 / /tmp/node-other/x rw - tmpfs tmpfs rw
34 30 0:44 / /tmp/node/with\\040space rw - tmpfs tmpfs rw
"""


def test_mounts_under_lists_only_the_node_dir_deepest_first() -> None:
    points = mounts_under(Path("/tmp/node"), MOUNTINFO)
    assert points[-1] == "/tmp/node"
    assert "/tmp/node-other/x" not in points
    assert "/tmp/node/with space" in points
    assert points.index("/tmp/node/kubelet/pods/a/volumes/x") < points.index("/tmp/node")
    assert set(points) == {
        "/tmp/node",
        "/tmp/node/kubelet/pods/a/volumes/x",
        "/tmp/node/containerd/state/netns/cni-1",
        "/tmp/node/with space",
    }
