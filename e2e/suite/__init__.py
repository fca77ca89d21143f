"""End-to-end scenario suite: runs against any cluster with the driver installed.

Scenario manifests live in ``e2e/scenarios/<name>/`` (numbered YAML files users can apply
themselves); ``scenarios.SCENARIOS`` says what each must show; ``runner`` runs and judges one;
``views`` is the pure comparison of what a container saw with what its claim was allocated.

``python -m e2e.suite --kubeconfig PATH`` runs them all (``-k NAME`` for some); the local test
tier runs the same through ``tests/node/test_scenarios.py`` against the real local node.
"""
