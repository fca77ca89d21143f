"""``make demo``: the driver on the local cluster with example claims (``run``), the environment
it keeps up between commands (``env``), and what it prints (``view``, ``prepare``).
"""
