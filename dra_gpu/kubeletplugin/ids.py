"""Identifier types shared by prepare, CDI and the checkpoint.

``NewType`` keeps a claim UID from being passed where a device name is expected; at run time
they are plain strings (JSON and protobuf take them as they are).
"""

from __future__ import annotations

from typing import NewType

ClaimUID = NewType("ClaimUID", str)
DeviceName = NewType("DeviceName", str)
CDIDeviceID = NewType("CDIDeviceID", str)
