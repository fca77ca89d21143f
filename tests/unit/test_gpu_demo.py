"""The GPU node demo's pieces that run without a GPU: log parsing, staging, and a clear refusal.

Cases: a claim pod's report is parsed into device count, UUIDs and nvidia-smi's list; a pod
without a driver parses as zero devices; the staged archive's parts join back into the same
files and their manifest verifies with ``sha256sum -c`` (what the GPU machine runs); a missing
part is detected; the demo on a machine without NVML exits 2 naming why.
"""

from __future__ import annotations

import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from dra_gpu import DRIVER_NAME
from dra_gpu.top.source import parse_text
from e2e.gpu import claim_facts, demo, share_pods, stage, telemetry_pods

ONE = """cuda-driver: 13.0
cuda-devices: 1
cuda-device 0: uuid=GPU-b89a1853-a419-1a9e-796f-e896f3c05262 memory=150754820096 name=NVIDIA H200
nvidia-smi:
GPU 0: NVIDIA H200 (UUID: GPU-b89a1853-a419-1a9e-796f-e896f3c05262)
check-done
"""
NONE = """cuda-driver: none (libcuda.so.1: cannot open shared object file)
cuda-devices: 0
nvidia-smi:
/bin/sh: nvidia-smi: not found
check-done
"""


def test_a_claim_pods_report_gives_its_device() -> None:
    seen = demo.parse_log("cuda-one", ONE)
    assert seen.cuda_devices == 1
    assert seen.cuda_uuids == ("GPU-b89a1853-a419-1a9e-796f-e896f3c05262",)
    assert seen.cuda_names == ("NVIDIA H200",)
    assert seen.smi_uuids == seen.cuda_uuids


def test_a_pod_without_a_driver_reports_no_device() -> None:
    seen = demo.parse_log("cuda-none", NONE)
    assert (seen.cuda_devices, seen.cuda_uuids, seen.smi_uuids) == (0, (), ())


def test_an_unfinished_report_is_not_a_zero() -> None:
    assert demo.parse_log("x", "cuda-driver: 13.0\n").cuda_devices == -1


def _stage(tmp_path: Path, *, part_bytes: int) -> tuple[list[Path], dict[str, bytes]]:
    files = {f"cache/k8s/bin{i}": bytes(range(256)) * (40 + i) for i in range(5)}
    sources = []
    for name, data in files.items():
        src = tmp_path / "src" / name
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(data)
        sources.append(stage.Item(src, name))
    return stage.write_parts(sources, tmp_path / "out", part_bytes=part_bytes), files


def test_staged_parts_join_back_into_the_same_files(tmp_path: Path) -> None:
    parts, files = _stage(tmp_path, part_bytes=200)
    assert len(parts) > 1
    joined = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(joined))) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert got == files
    # What remote.sh does: the repository's lock beside the parts, checked with them.
    shutil.copy(stage.REPO / "requirements.lock", tmp_path / "out" / "requirements.lock")
    check = subprocess.run(["sha256sum", "-c", "manifest"], cwd=tmp_path / "out")
    assert check.returncode == 0


def test_parts_staged_for_other_dependencies_fail_the_manifest_check(tmp_path: Path) -> None:
    _stage(tmp_path, part_bytes=200)
    (tmp_path / "out" / "requirements.lock").write_text("grpcio==0.1\n")  # another checkout's
    check = subprocess.run(
        ["sha256sum", "--quiet", "-c", "manifest"], cwd=tmp_path / "out", capture_output=True
    )
    assert check.returncode != 0 and b"requirements.lock: FAILED" in check.stdout


def test_a_missing_part_fails_the_manifest_check(tmp_path: Path) -> None:
    parts, _ = _stage(tmp_path, part_bytes=200)
    parts[-1].unlink()
    check = subprocess.run(
        ["sha256sum", "--quiet", "-c", "manifest"], cwd=tmp_path / "out", capture_output=True
    )
    assert check.returncode != 0


def test_the_demo_without_a_gpu_says_why_and_exits_2() -> None:
    if demo.nvml_present() is None:
        return  # a GPU machine: the demo would run for real
    result = subprocess.run(
        [sys.executable, "-m", "e2e.gpu.demo"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "cannot run: NVML" in result.stderr


UUID = "GPU-b89a1853-a419-1a9e-796f-e896f3c05262"
FACTS = claim_facts.NvmlFacts(UUID, "NVIDIA H200", "0000:00:06.0", None, "NVML: Not Supported")


def _metadata_log(uuid: str, *, numa: int | None = None) -> str:
    attrs: dict[str, dict[str, object]] = {
        "uuid": {"string": uuid},
        "productName": {"string": "NVIDIA H200"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:00:06.0"},
    }
    if numa is not None:
        attrs["resource.kubernetes.io/numaNode"] = {"int": numa}
    doc = {
        "apiVersion": "metadata.resource.k8s.io/v1alpha1",
        "kind": "DeviceMetadata",
        "requests": [
            {
                "name": "gpu",
                "devices": [
                    {"driver": DRIVER_NAME, "pool": "n", "name": "gpu-0", "attributes": attrs}
                ],
            }
        ],
    }
    path = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu"
    body = json.dumps(doc, indent=2)
    return f"{ONE}metadata-file: {path}/{DRIVER_NAME}-metadata.json\n{body}\nmetadata-end\n"


def _claim(uuid: str) -> dict[str, object]:
    entry = {
        "driver": DRIVER_NAME,
        "pool": "n",
        "device": "gpu-0",
        "conditions": [{"type": "Ready", "status": "True"}],
        "data": {"uuid": uuid, "productName": "NVIDIA H200", "pciBusID": "0000:00:06.0"},
    }
    return {"status": {"devices": [entry]}}


def test_the_gpus_status_metadata_and_numa_node_match_nvml() -> None:
    found = claim_facts.check(
        claim=_claim(UUID), device="gpu-0", published={}, log=_metadata_log(UUID), nvml=FACTS
    )
    assert [f.ok for f in found] == [True, True, True], found


def test_a_wrong_uuid_or_a_numa_node_nvml_does_not_know_fails() -> None:
    other = "GPU-00000000-0000-0000-0000-000000000000"
    found = claim_facts.check(
        claim=_claim(other),
        device="gpu-0",
        published={"resource.kubernetes.io/numaNode": 0},
        log=_metadata_log(other, numa=0),
        nvml=FACTS,
    )
    assert [f.ok for f in found] == [False, False, False], found


def test_a_pod_without_a_metadata_file_fails_the_metadata_check() -> None:
    found = claim_facts.check(claim=_claim(UUID), device="gpu-0", published={}, log=ONE, nvml=FACTS)
    assert [f.ok for f in found] == [True, False, True]


def test_pod_series_are_read_by_pod_from_the_plugins_metrics() -> None:
    text = (
        "# TYPE dra_gpu_pod_memory_used_bytes gauge\n"
        'dra_gpu_pod_memory_used_bytes{pod_namespace="gpu-demo",pod_name="shared-a"} 1.3e+09\n'
        'dra_gpu_pod_memory_used_bytes{pod_namespace="other",pod_name="x"} 5\n'
        "# TYPE dra_gpu_pod_utilization_ratio gauge\n"
        'dra_gpu_pod_utilization_ratio{pod_namespace="gpu-demo",pod_name="shared-a"} 0.97\n'
    )
    usage = telemetry_pods.pods_usage(parse_text(text), "gpu-demo")
    assert usage == {"shared-a": telemetry_pods.PodUsage(1.3e9, 0.97, None)}


def test_share_pods_ask_for_their_memory_and_the_greedy_container_for_the_whole_gpu() -> None:
    claim = share_pods.share_claim("share-big", 40)
    request = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert request["capacity"] == {"requests": {"memory": "40Gi"}}
    pod = share_pods.share_pod("share-small", greedy=True)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["alloc", "greedy"]
    assert pod["spec"]["containers"][1]["env"] == [share_pods.GREEDY_ENV]
