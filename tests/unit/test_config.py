"""Opaque config API (``resource.nvidia.com/v1beta1``).

Cases:
- valid configs of both kinds decode to the written values;
- every invalid input gives a ConfigError naming the field path and the reason;
- normalize fills defaults and is idempotent;
- quantities convert exactly;
- the committed JSON Schema files equal the export from the models.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.config import (
    ConfigError,
    GpuConfig,
    MigDeviceConfig,
    MpsConfig,
    TimeSlicingConfig,
    default_gpu_config,
    default_mig_device_config,
    normalized,
    parse_opaque_config,
)
from dra_gpu.config import schema as config_schema
from dra_gpu.config.quantity import QuantityError, to_bytes

API = "resource.nvidia.com/v1beta1"


def gpu(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", **fields}


def mig(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "MigDeviceConfig", **fields}


def mps_limit(limit: object) -> dict[str, Any]:
    return gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": limit}})


def mps_per_device(limits: dict[str, object]) -> dict[str, Any]:
    return gpu(
        sharing={"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": limits}}
    )


VALID = [
    pytest.param(gpu(), GpuConfig, id="gpu-empty"),
    pytest.param(gpu(sharing={"strategy": "TimeSlicing"}), GpuConfig, id="gpu-ts-bare"),
    pytest.param(
        gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
        GpuConfig,
        id="gpu-ts-long",
    ),
    pytest.param(
        gpu(
            sharing={
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi", "GPU-abc-123": 1048576},
                },
            }
        ),
        GpuConfig,
        id="gpu-mps-full",
    ),
    pytest.param(mps_limit("1Mi"), GpuConfig, id="mps-limit-1Mi"),
    pytest.param(mps_limit("9223372036854775807"), GpuConfig, id="mps-limit-max"),
    pytest.param(mig(), MigDeviceConfig, id="mig-empty"),
    pytest.param(mig(sharing={"strategy": "TimeSlicing"}), MigDeviceConfig, id="mig-ts"),
    pytest.param(
        mig(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}),
        MigDeviceConfig,
        id="mig-mps",
    ),
]


@pytest.mark.parametrize(("params", "kind"), VALID)
def test_valid_configs_decode(params: dict[str, Any], kind: type) -> None:
    config = parse_opaque_config(params)
    assert isinstance(config, kind)
    assert config.model_dump(exclude_none=True) == _without_int_quantities(params)


def _without_int_quantities(params: dict[str, Any]) -> dict[str, Any]:
    # Integer quantities are stored as their decimal text.
    mps = params.get("sharing", {}).get("mpsConfig", {})
    per_device = mps.get("defaultPerDevicePinnedMemoryLimit")
    if per_device:
        per_device.update({k: str(v) for k, v in per_device.items()})
    return params


INVALID = [
    pytest.param({"kind": "GpuConfig"}, "apiVersion: required field is missing", id="no-api"),
    pytest.param(
        {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
        "apiVersion: unsupported value 'resource.nvidia.com/v1'",
        id="wrong-api",
    ),
    pytest.param(gpu(kind="TpuConfig"), "kind: unsupported value 'TpuConfig'", id="unknown-kind"),
    pytest.param({"apiVersion": API}, "kind: required field is missing", id="no-kind"),
    pytest.param(gpu(shareing={}), "shareing: unknown field", id="unknown-top-field"),
    pytest.param(
        gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {}}),
        "sharing.timeSlicing: unknown field",
        id="unknown-nested-field",
    ),
    pytest.param(
        gpu(sharing={"strategy": "Fractional"}),
        "sharing.strategy: must be one of 'TimeSlicing' or 'MPS', got 'Fractional'",
        id="unknown-strategy",
    ),
    pytest.param(gpu(sharing={}), "sharing.strategy: required field is missing", id="no-strategy"),
    pytest.param(
        gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {}, "mpsConfig": {}}),
        "sharing.mpsConfig: must not be set when strategy is TimeSlicing",
        id="both-configs-ts",
    ),
    pytest.param(
        gpu(sharing={"strategy": "MPS", "timeSlicingConfig": {"interval": "Short"}}),
        "sharing.timeSlicingConfig: must not be set when strategy is MPS",
        id="ts-config-with-mps",
    ),
    pytest.param(
        mig(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}),
        "sharing.mpsConfig: must not be set when strategy is TimeSlicing",
        id="mig-mps-config-with-ts",
    ),
    pytest.param(
        mig(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {}}),
        "sharing.timeSlicingConfig: unknown field",
        id="mig-has-no-timeslicing-config",
    ),
    pytest.param(
        gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Huge"}}),
        "sharing.timeSlicingConfig.interval: must be one of",
        id="bad-interval",
    ),
    pytest.param(
        gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
        "sharing.mpsConfig.defaultActiveThreadPercentage: Input should be less than or equal",
        id="percentage-high",
    ),
    pytest.param(
        gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}),
        "sharing.mpsConfig.defaultActiveThreadPercentage: Input should be a valid integer",
        id="percentage-string-not-coerced",
    ),
    pytest.param(
        gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1 GB"}}),
        "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: '1 GB' is not a valid quantity",
        id="bad-quantity",
    ),
    pytest.param(
        gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "-1Gi"}}),
        "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must not be negative, got '-1Gi'",
        id="negative-quantity",
    ),
    pytest.param(
        gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": -5}}),
        "defaultPinnedDeviceMemoryLimit: must not be negative, got '-5'",
        id="negative-integer-quantity",
    ),
    # NVIDIA's driver refuses a limit that is 0 in whole MiB (what the MPS daemon takes).
    pytest.param(mps_limit("0"), "must be at least 1Mi", id="mps-limit-zero"),
    pytest.param(mps_limit("512Ki"), "must be at least 1Mi", id="mps-limit-512Ki"),
    pytest.param(mps_limit("1M"), "must be at least 1Mi", id="mps-limit-1M-is-under-1Mi"),
    pytest.param(mps_limit(1048575), "must be at least 1Mi", id="mps-limit-int-under-1Mi"),
    pytest.param(
        mps_per_device({"0": "512Ki"}),
        "defaultPerDevicePinnedMemoryLimit.0: must be at least 1Mi",
        id="mps-per-device-limit-under-1Mi",
    ),
    # A trailing newline is a different value, not whitespace to ignore: it reached the
    # container environment.
    pytest.param(mps_limit("1Gi\n"), r"'1Gi\n' is not a valid quantity", id="quantity-newline"),
    pytest.param(
        mps_per_device({"0\n": "1Gi"}),
        r"defaultPerDevicePinnedMemoryLimit['0\n']: '0\n' is neither a device index",
        id="device-key-newline",
    ),
    pytest.param(mps_limit("1e999999"), "must be at most 9223372036854775807", id="huge-exponent"),
    pytest.param(
        mps_limit("1e9999999999"), "must be at most 9223372036854775807", id="huger-exponent"
    ),
    pytest.param(mps_limit("8Ei"), "must be at most 9223372036854775807", id="8Ei"),
    pytest.param(mps_limit(2**63), "must be at most 9223372036854775807", id="int-over-max"),
    pytest.param(mps_limit(10**5000), "must be at most", id="int-of-5000-digits"),
    pytest.param(
        mps_limit(0.5),
        "must be at least 1Mi (the MPS daemon counts in MiB), got '0.5'",
        id="float-under-1Mi",
    ),
    pytest.param(mps_limit(-1.5e9), "must not be negative, got '-1500000000.0'", id="float-neg"),
    pytest.param(
        gpu(
            sharing={
                "strategy": "MPS",
                "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu0": "1Gi"}},
            }
        ),
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.gpu0",
        id="bad-device-key",
    ),
    pytest.param(
        gpu(sharing="MPS"), "sharing: must be an object, got str", id="sharing-not-object"
    ),
]


@pytest.mark.parametrize(("params", "message"), INVALID)
def test_invalid_configs_name_field_and_reason(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_opaque_config(params)
    assert message in str(info.value)
    assert info.value.problems, "a ConfigError always lists its problems"


LONG = "x" * 5000


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(mps_limit(LONG), id="quantity"),
        pytest.param(gpu(kind=LONG), id="kind"),
        pytest.param({"apiVersion": LONG, "kind": "GpuConfig"}, id="apiVersion"),
        pytest.param(gpu(sharing={"strategy": LONG}), id="strategy"),
        pytest.param(gpu(**{LONG: 1}), id="unknown-field-name"),
        pytest.param(mps_per_device({LONG: "1Gi"}), id="device-key"),
        pytest.param(gpu(**{f"f{i}": 1 for i in range(1000)}), id="1000-unknown-fields"),
    ],
)
def test_errors_echo_at_most_a_short_part_of_the_input(params: dict[str, Any]) -> None:
    # The rejected value is named (so the user finds it) but not echoed in full: 5,000
    # characters of it buried the reason in the webhook's answer and in the node log.
    with pytest.raises(ConfigError) as info:
        parse_opaque_config(params)
    assert len(str(info.value)) < 600, str(info.value)
    assert "5000 characters" in str(info.value) or "and 980 more problems" in str(info.value)


def nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


DEEP = nested(5000)  # about 10 KiB of JSON, the most an opaque config may hold


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param(
            {"apiVersion": DEEP, "kind": "GpuConfig"}, "apiVersion: unsupported value a list"
        ),
        pytest.param(gpu(kind=DEEP), "kind: unsupported value a list", id="kind"),
        pytest.param(
            gpu(sharing={"strategy": DEEP}), "sharing.strategy: must be one of", id="strategy"
        ),
        pytest.param(
            gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": DEEP}}),
            "sharing.timeSlicingConfig.interval: must be one of",
            id="interval",
        ),
        pytest.param(gpu(x=DEEP), "x: unknown field", id="unknown-field"),
        pytest.param(
            mps_limit(DEEP), "defaultPinnedDeviceMemoryLimit: Input should be", id="quantity"
        ),
    ],
)
def test_deeply_nested_values_are_refused_by_name(params: dict[str, Any], message: str) -> None:
    # Quoting the value in the message used its repr, which raised RecursionError: an internal
    # error in prepare, no answer from the webhook.
    with pytest.raises(ConfigError) as info:
        parse_opaque_config(params)
    assert message in str(info.value)
    assert len(str(info.value)) < 200


def test_a_json_number_is_a_quantity_as_kubernetes_reads_it() -> None:
    # resource.Quantity parses an unquoted JSON number's text; NVIDIA's config types use it.
    config = parse_opaque_config(mps_limit(1.5e9))
    assert isinstance(config, GpuConfig) and config.sharing and config.sharing.mpsConfig
    limit = config.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit
    assert limit is not None and to_bytes(limit) == 1_500_000_000


def test_every_problem_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        parse_opaque_config(gpu(a=1, b=2))
    assert [p.path for p in info.value.problems] == ["a", "b"]


NORMALIZE = [
    pytest.param(parse_opaque_config(gpu()), default_gpu_config(), id="gpu-default"),
    pytest.param(parse_opaque_config(mig()), default_mig_device_config(), id="mig-default"),
    pytest.param(
        parse_opaque_config(gpu(sharing={"strategy": "TimeSlicing"})),
        default_gpu_config(),
        id="gpu-ts-gets-default-interval",
    ),
    pytest.param(
        parse_opaque_config(gpu(sharing={"strategy": "MPS"})),
        parse_opaque_config(gpu(sharing={"strategy": "MPS", "mpsConfig": {}})),
        id="gpu-mps-gets-empty-config",
    ),
    pytest.param(
        parse_opaque_config(mig(sharing={"strategy": "MPS"})),
        parse_opaque_config(mig(sharing={"strategy": "MPS", "mpsConfig": {}})),
        id="mig-mps-gets-empty-config",
    ),
]


@pytest.mark.parametrize(("config", "expected"), NORMALIZE)
def test_normalize_fills_defaults_idempotently(
    config: GpuConfig | MigDeviceConfig, expected: GpuConfig | MigDeviceConfig
) -> None:
    once = normalized(config)
    assert once == expected
    assert normalized(once) == once


def test_defaults_are_valid_configs() -> None:
    for config in (default_gpu_config(), default_mig_device_config()):
        assert parse_opaque_config(config.model_dump(exclude_none=True)) == config


def test_models_are_frozen() -> None:
    config = TimeSlicingConfig(interval="Short")
    with pytest.raises(ValueError):
        config.interval = "Long"
    assert MpsConfig().defaultActiveThreadPercentage is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1024", 1024),
        ("1Ki", 1024),
        ("1.5Gi", 3 * 2**29),
        ("500M", 500_000_000),
        ("1e3", 1000),
        ("1500m", 2),
        ("+2k", 2000),
        ("1e-9999999999", 1),  # any positive size rounds up to a whole byte
        ("123456789012345678.5", 123456789012345679),
        ("0.000000000000000000000000000001e30", 1),
        ("7.999999999999999999Ei", 9223372036854775807),
    ],
)
def test_quantity_to_bytes(text: str, value: int) -> None:
    assert to_bytes(text) == value


@pytest.mark.parametrize(
    "text", ["", "Gi", "1GB", "1 Gi", "-5", "0x10", "1.2.3", "1Gi\n", " 1Gi", "1e99999999999"]
)
def test_quantity_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        to_bytes(text)


def test_committed_json_schema_matches_models() -> None:
    assert config_schema.main(["--check"]) == 0, "run: python -m dra_gpu.config.schema"
