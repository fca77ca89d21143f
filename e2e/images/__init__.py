"""Container images built without a registry: the node's sandbox and test images
(``node_images``, ``python -m e2e.images``), and the driver's image with Docker (``base``,
``driver``, ``docker_engine``).
"""
