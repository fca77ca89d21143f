"""``python -m e2e.deployed`` (what ``make e2e-deployed`` runs)."""

from e2e.deployed import run

raise SystemExit(run.main())
