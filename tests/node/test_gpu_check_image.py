"""The CUDA check image of the GPU node demo runs on a real node.

On a GPU machine the image reports what CUDA sees (``e2e.gpu.demo``); here, with no NVIDIA
driver, the same image must start under containerd + runc, load its bundled C library, and say
plainly that there is no CUDA device. A broken layout (missing loader, wrong library directory,
a binary linked against something the image lacks) fails here, before a GPU run is spent on it.
"""

from __future__ import annotations

from e2e.gpu import demo, image
from e2e.images import node_images as images
from e2e.node.kubelet_node import Node
from e2e.suite.kube import Kube, wait_for


def test_the_check_image_reports_no_cuda_device_on_a_node_without_a_driver(
    real_nodes: dict[str, Node], kube: Kube
) -> None:
    name, node = next(iter(real_nodes.items()))
    node.import_archives({image.CHECK_IMAGE: image.ensure_check_image(images.cache_dir())})
    namespace = "gpu-check-image"
    kube.create_namespace(namespace)
    try:
        pod = demo.check_pod("check", claim=None)
        pod["spec"]["nodeName"] = name
        kube.create(namespace, pod)

        def finished() -> str | None:
            log = kube.log(namespace, "check", "check")
            return log if demo.DONE in log else None

        log = wait_for("the check pod's report", finished, timeout=120)
        seen = demo.parse_log("check", log)
        assert seen.cuda_devices == 0, log
        assert "cuda-driver: none (libcuda.so.1: cannot open shared object file" in log
        assert "nvidia-smi: not found" in log
    finally:
        kube.delete_namespace(namespace)
