"""``python -m e2e.cluster {up,down,env,logs}``."""

import sys

from e2e.cluster import cli

sys.exit(cli.main())
