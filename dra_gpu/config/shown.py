"""Rejected input as it appears in an error message: short, and safe to build for any input.

Error messages name the value they refuse so the user can find it, but the value is the user's
(up to the 10 KiB an opaque config may hold, or a whole claim in the webhook): echoed in full it
buries the reason and multiplies into logs, events and API responses. Every message of this
package that quotes input goes through :func:`shown`: a scalar as its ``repr`` cut to
:data:`LIMIT` characters, a list or object by its JSON type only (its ``repr`` could be any size
and, nested a few thousand levels deep, cannot even be built).
"""

from __future__ import annotations

import math
from typing import Final

LIMIT: Final = 64


def shown(value: object, limit: int = LIMIT) -> str:
    """A short description of ``value`` for an error message."""
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        # str() of an int over 4300 digits raises; the size is what matters here anyway
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
