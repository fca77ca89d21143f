"""``dra-gpu validate`` in the GPU demo: its command line and the checks read from its output.

Cases: the command names the node, the plugin's /readyz, the check image, the node's CDI root,
the namespace and the timeout; a run that passed every step on a real GPU passes all three
checks, the pod check naming the device and its UUID; a check pod without ``nvidia-smi`` (no
UUID in the pod line) fails the UUID check; a UUID other than the one published fails it; a run
that stopped at the pod step fails exit, order and UUID checks, saying which steps passed; the
Node label check wants the version; a validate that hangs is killed and judged by what it
printed; the report section shows the command as a user types it and, on a failure, the end of
stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dra_gpu.validate import steps
from e2e.gpu import validate_node
from e2e.gpu.validate_node import Ran

UUID = "GPU-589c5a62-eede-cf93-03f1-c8c713e669dd"
PUBLISHED = {"gpu-0": UUID}
REPORT = """== env
GPU_DEVICE_0=gpu-0
HOME=/root
== devices
/dev/nvidia-uvm
/dev/nvidia-uvm-tools
/dev/nvidia0
/dev/nvidiactl
== nvidia-smi
{smi}== end
"""
COMMAND = validate_node.argv(
    node="gpu-node",
    kubeconfig=Path("/tmp/c/kubeconfig"),
    namespace="gpu-demo",
    readyz_url="http://127.0.0.1:41234/readyz",
    image="localhost/dra-gpu/cuda-check:2",
    cdi_root=Path("/tmp/n/cdi"),
    timeout_s=120.0,
)


def pod_line(smi: str) -> str:
    """The pod step's line as validate prints it (``steps.judge_container``)."""
    report = steps.parse_report(REPORT.format(smi=smi))
    assert report is not None
    return steps.judge_container(
        report, ["gpu-0"], PUBLISHED, "gpu-demo/dra-gpu-validate-1a2b3c"
    ).line()


def output(pod: str, *, rest: bool = True) -> str:
    lines = [
        steps.passed("node", "node gpu-node exists").line(),
        steps.judge_readyz("http://127.0.0.1:41234/readyz", 200, "ok").line(),
        steps.passed("slices", "1 devices on 1 GPUs, matching discovery (1 x NVIDIA-H200)").line(),
        pod,
    ]
    if rest:
        lines += [
            steps.passed(
                "cdi", "the claim's CDI spec is gone from /tmp/n/cdi after the pod"
            ).line(),
            "recorded on node gpu-node: label gpu.nvidia.com/validated=0.1.0,"
            " Event GpuNodeValidated",
            "node gpu-node: validation passed (plugin version 0.1.0)",
        ]
    else:
        lines += [
            "SKIP  cdi",
            "node gpu-node: validation FAILED (plugin version 0.1.0)",
        ]
    return "\n".join(lines) + "\n"


REAL_GPU = f"GPU 0: NVIDIA H200 (UUID: {UUID})\n"


def test_the_command_line_asks_the_plugins_readyz_with_the_check_image() -> None:
    assert COMMAND[1:] == [
        *("-m", "dra_gpu", "validate", "--node", "gpu-node"),
        *("--kubeconfig", "/tmp/c/kubeconfig", "--namespace", "gpu-demo"),
        *("--plugin-readyz", "http://127.0.0.1:41234/readyz"),
        *("--image", "localhost/dra-gpu/cuda-check:2", "--cdi-root", "/tmp/n/cdi"),
        *("--timeout", "120"),
    ]


def test_a_run_that_passed_on_a_real_gpu_passes_and_names_the_uuid() -> None:
    ran = Ran(tuple(COMMAND), 0, output(pod_line(REAL_GPU)), "")
    checks = validate_node.judge(ran, PUBLISHED)
    assert [ok for _what, ok, _detail in checks] == [True, True, True], checks
    assert checks[1][2] == "PASS node, PASS plugin, PASS slices, PASS pod, PASS cdi"
    assert checks[2][2] == f"gpu-0: nvidia-smi -L {UUID}, published {UUID}"


def test_a_check_pod_without_nvidia_smi_fails_the_uuid_check() -> None:
    ran = Ran(tuple(COMMAND), 0, output(pod_line("")), "")
    checks = validate_node.judge(ran, PUBLISHED)
    assert [ok for _what, ok, _detail in checks] == [True, True, False]
    assert checks[2][2] == f"gpu-0: nvidia-smi -L listed nothing, published {UUID}"


def test_a_uuid_other_than_the_published_fails_the_uuid_check() -> None:
    ran = Ran(tuple(COMMAND), 0, output(pod_line(REAL_GPU)), "")
    other = {"gpu-0": "GPU-00000000-0000-0000-0000-000000000000"}
    assert not validate_node.judge(ran, other)[2][1]


def test_a_run_stopped_at_the_pod_says_which_steps_passed() -> None:
    failed = pod_line("GPU 0: NVIDIA H200 (UUID: GPU-other)\n")
    assert failed.startswith("FAIL  pod:")
    ran = Ran(tuple(COMMAND), 1, output(failed, rest=False), "")
    checks = validate_node.judge(ran, PUBLISHED)
    assert [ok for _what, ok, _detail in checks] == [False, False, False]
    assert checks[0][2] == "node gpu-node: validation FAILED (plugin version 0.1.0) (exit 1)"
    assert checks[1][2] == "PASS node, PASS plugin, PASS slices, FAIL pod, SKIP cdi"
    assert checks[2][2].startswith("no pod line")


def test_the_node_label_must_carry_the_version() -> None:
    what, ok, detail = validate_node.judge_recorded({"gpu.nvidia.com/validated": "0.1.0"}, "0.1.0")
    assert ok and what == "the Node is labelled gpu.nvidia.com/validated=0.1.0"
    assert detail == "gpu.nvidia.com/validated=0.1.0"
    assert not validate_node.judge_recorded({}, "0.1.0")[1]


def test_the_section_shows_the_command_and_on_failure_stderr() -> None:
    ran = Ran(tuple(COMMAND), 0, output(pod_line(REAL_GPU)), "")
    shown = validate_node.lines(ran)
    assert shown[0].startswith("$ dra-gpu validate --node gpu-node --kubeconfig ")
    assert shown[1:] == ran.stdout.rstrip().splitlines()
    crashed = Ran(tuple(COMMAND), 1, "", "Traceback ...\nImportError: no module named x\n")
    assert validate_node.lines(crashed)[1:] == [
        "stderr:",
        "Traceback ...",
        "ImportError: no module named x",
    ]
    assert validate_node.judge(crashed, PUBLISHED)[0][2] == (
        "Traceback ...\nImportError: no module named x (exit 1)"
    )


def test_a_validate_that_hangs_is_killed_and_judged_with_what_it_printed() -> None:
    hangs = [
        sys.executable,
        "-c",
        "print('PASS  node: x', flush=True); import time; time.sleep(600)",
    ]
    ran = validate_node.run(hangs, timeout_s=3)
    assert (ran.returncode, ran.stdout, ran.stderr) == (124, "PASS  node: x\n", "killed after 3 s")
    assert validate_node.judge(ran, PUBLISHED)[1][2] == "PASS node"
