"""The project's error base: what a user must fix, and what went wrong inside.

- :class:`UserError`: bad input (flags, a claim, a config, a profile, a node's setup). The
  message names what is wrong and is shown as it is (CLI stderr, the pod's events, the log),
  without a traceback.
- :class:`InternalError`: this program or its own state went wrong (e.g. a checkpoint it
  cannot use); logged with context, and reported as an internal error where a user sees it.

Each concrete error keeps its standard base too (``ValueError``, ``RuntimeError``), so code
that catches those goes on working.
"""

from __future__ import annotations


class DraGpuError(Exception):
    """Base of every error this project raises on purpose."""


class UserError(DraGpuError):
    """Bad input; the message says what is wrong and is shown as is."""


class InternalError(DraGpuError):
    """Not the user's input: this program, its state or its environment failed."""
