"""The generated messages use the kubelet's field numbers and wire types.

Expected bytes are built by hand from the protobuf encoding rules (tag = field << 3 | wire type,
base-128 varints, length-delimited strings and messages), independent of the generated code.
Each case checks both directions: the generated class parses the hand-made bytes into the
expected values, and serializes those values back to exactly the same bytes.

Cases: Device (v1 with share_id = 5, including an explicitly empty share_id; v1beta1 without it),
Claim, the claim-UID map of NodePrepareResourcesResponse, PluginInfo, RegistrationStatus,
DeviceHealth (v1alpha1 and v1) and the HealthStatus enum values.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import Message

from dra_gpu.pb import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    pluginregistration_v1_pb2,
)

VARINT = 0
LEN = 2


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def int_field(field: int, value: int) -> bytes:
    return tag(field, VARINT) + varint(value)


def bytes_field(field: int, data: bytes) -> bytes:
    return tag(field, LEN) + varint(len(data)) + data


def str_field(field: int, text: str) -> bytes:
    return bytes_field(field, text.encode())


def test_varint_helper_matches_protobuf_spec_example() -> None:
    # The encoding guide's example: 150 is 0x96 0x01; field 1 varint 150 is 08 96 01.
    assert int_field(1, 150) == b"\x08\x96\x01"


DEVICE_COMMON = (
    str_field(1, "gpu")
    + str_field(1, "mig")
    + str_field(2, "node-a")
    + str_field(3, "gpu-0")
    + str_field(4, "k8s.gpu.example.com/gpu=gpu-0")
    + str_field(4, "k8s.gpu.example.com/claim=uid-1")
)
DEVICE_VALUES: dict[str, Any] = {
    "request_names": ["gpu", "mig"],
    "pool_name": "node-a",
    "device_name": "gpu-0",
    "cdi_device_ids": ["k8s.gpu.example.com/gpu=gpu-0", "k8s.gpu.example.com/claim=uid-1"],
}
# A large varint (> 4 bytes) proves int64 fields are varints, not fixed-width.
HEALTH_TIME = 1_767_225_600
HEALTH_BYTES = (
    bytes_field(1, str_field(1, "node-a") + str_field(2, "gpu-0-mig-3"))
    + int_field(2, 2)
    + int_field(3, HEALTH_TIME)
    + int_field(4, 30)
    + str_field(5, "XID 79: GPU has fallen off the bus")
)


def health_values(pb: Any) -> dict[str, Any]:
    return {
        "device": pb.DeviceIdentifier(pool_name="node-a", device_name="gpu-0-mig-3"),
        "health": pb.UNHEALTHY,
        "last_updated_time": HEALTH_TIME,
        "health_check_timeout_seconds": 30,
        "message": "XID 79: GPU has fallen off the bus",
    }


CASES: list[tuple[str, type[Message], dict[str, Any], bytes]] = [
    (
        "v1-Device",
        dra_v1_pb2.Device,
        {**DEVICE_VALUES, "share_id": "share-7"},
        DEVICE_COMMON + str_field(5, "share-7"),
    ),
    # share_id is `optional`: an explicitly empty value is present and is sent on the wire.
    ("v1-Device-empty-share", dra_v1_pb2.Device, {"share_id": ""}, str_field(5, "")),
    ("v1beta1-Device", dra_v1beta1_pb2.Device, DEVICE_VALUES, DEVICE_COMMON),
    (
        "v1-Claim",
        dra_v1_pb2.Claim,
        {"namespace": "ns", "uid": "uid-1", "name": "claim"},
        str_field(1, "ns") + str_field(2, "uid-1") + str_field(3, "claim"),
    ),
    (
        "v1-NodePrepareResourcesResponse-map",
        dra_v1_pb2.NodePrepareResourcesResponse,
        {
            "claims": {
                "uid-1": dra_v1_pb2.NodePrepareResourceResponse(
                    devices=[dra_v1_pb2.Device(device_name="gpu-0")], error="boom"
                )
            }
        },
        # A map entry is a nested message with key = 1 and value = 2.
        bytes_field(
            1,
            str_field(1, "uid-1")
            + bytes_field(2, bytes_field(1, str_field(3, "gpu-0")) + str_field(2, "boom")),
        ),
    ),
    (
        "PluginInfo",
        pluginregistration_v1_pb2.PluginInfo,
        {
            "type": "DRAPlugin",
            "name": "gpu.example.com",
            "endpoint": "/var/lib/kubelet/plugins/gpu.example.com/dra.sock",
            "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        },
        str_field(1, "DRAPlugin")
        + str_field(2, "gpu.example.com")
        + str_field(3, "/var/lib/kubelet/plugins/gpu.example.com/dra.sock")
        + str_field(4, "v1.DRAPlugin")
        + str_field(4, "v1beta1.DRAPlugin"),
    ),
    (
        "RegistrationStatus",
        pluginregistration_v1_pb2.RegistrationStatus,
        {"plugin_registered": True, "error": "nope"},
        int_field(1, 1) + str_field(2, "nope"),
    ),
    (
        "v1alpha1-DeviceHealth",
        health_v1alpha1_pb2.DeviceHealth,
        health_values(health_v1alpha1_pb2),
        HEALTH_BYTES,
    ),
    ("v1-DeviceHealth", health_v1_pb2.DeviceHealth, health_values(health_v1_pb2), HEALTH_BYTES),
]


@pytest.mark.parametrize(
    ("cls", "values", "wire"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_hand_built_bytes_parse_to_expected_fields(
    cls: type[Message], values: dict[str, Any], wire: bytes
) -> None:
    parsed = cls.FromString(wire)
    for name, want in values.items():
        got = getattr(parsed, name)
        if isinstance(want, list | dict):
            got = list(got) if isinstance(want, list) else dict(got)
        assert got == want, name
    assert parsed == cls(**values)


@pytest.mark.parametrize(
    ("cls", "values", "wire"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_serialized_bytes_match_hand_built(
    cls: type[Message], values: dict[str, Any], wire: bytes
) -> None:
    assert cls(**values).SerializeToString() == wire


def test_v1_share_id_presence_survives_the_wire() -> None:
    assert dra_v1_pb2.Device.FromString(str_field(5, "")).HasField("share_id")
    assert not dra_v1_pb2.Device.FromString(str_field(3, "gpu-0")).HasField("share_id")


def test_v1beta1_device_has_no_share_id() -> None:
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    assert dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"].number == 5


@pytest.mark.parametrize("pb", [health_v1alpha1_pb2, health_v1_pb2], ids=["v1alpha1", "v1"])
def test_health_status_enum_numbers(pb: Any) -> None:
    assert dict(pb.HealthStatus.items()) == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }
