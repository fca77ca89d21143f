"""``python -m e2e.images``: the node's sandbox and test image archives."""

import sys

from e2e.images import node_images

sys.exit(node_images.main())
