"""GPU sharing applied on the node: time-slice intervals and per-claim MPS control daemons.

:mod:`runner` is the one way out to ``nvidia-smi`` and ``nvidia-cuda-mps-control`` (timeouts,
or a recording on simulated nodes); :mod:`timeslice` and :mod:`mps` say what to run for a
claim; :mod:`applied` is what prepare, unprepare and start-up call. See docs/concepts/sharing.md.
"""
