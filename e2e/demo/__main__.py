"""``python -m e2e.demo [status|down]`` (what ``make demo`` runs)."""

from e2e.demo import run

raise SystemExit(run.main())
