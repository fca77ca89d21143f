"""Rejected input as it appears in an error message: ``repr`` cut to a readable length.

Error messages name the value they refuse so the user can find it, but the value is the user's
(up to the 10 KiB an opaque config may hold, or a whole claim in the webhook): echoed in full it
buries the reason and multiplies into logs, events and API responses. Every message of this
package that quotes input goes through :func:`shown`.
"""

from __future__ import annotations

from typing import Final

LIMIT: Final = 64


def shown(value: object, limit: int = LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters with the full length said when cut."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else "<huge int>"
    if len(text) > limit:
        return f"{text[:limit]}... ({len(text)} characters)"
    return text
