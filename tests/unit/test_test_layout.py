"""The test tree itself: every test module's basename is unique across the tiers.

The tiers have no ``__init__.py``, so pytest imports each module by its basename; two modules of
one name (``tests/cluster/test_metrics.py`` and ``tests/node/test_metrics.py``) make a full
``make test`` stop at collection, while running either file alone passes. That happened twice.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_test_module_basenames_are_unique() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
