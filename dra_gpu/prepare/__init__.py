"""The GPU driver's prepare side: plan a claim, apply it (checkpoint, CDI spec), answer the kubelet.

Import the submodules directly; this package re-exports nothing.
"""
