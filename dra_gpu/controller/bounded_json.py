"""JSON decoding with a bound on nesting depth: pure, text in, value out.

Python's ``json`` module recurses once per nested array or object and gives up near the
interpreter's recursion limit (about 1,000 levels) with ``RecursionError``, which is not a
``ValueError``; the API server accepts objects nested up to 10,000 levels. So the webhook must
not hand an arbitrary body to ``json.loads``. :func:`loads` first finds, with one regular
expression pass (strings skipped whole, so brackets inside them do not count), every array or
object opened deeper than ``max_depth``; if there is none the text is decoded as it is,
otherwise each such subtree is replaced by ``null`` before decoding. The caller learns that
something was cut, and still gets the shallow part (an AdmissionReview's ``request.uid`` sits at
depth 2), so it can answer the request instead of dropping the connection.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

# A whole JSON string (escapes included), or one bracket.
_TOKENS: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


@dataclass(frozen=True)
class Decoded:
    value: Any
    # True when subtrees deeper than the bound were replaced by null.
    cut: bool


def _deep_spans(text: str, max_depth: int) -> list[tuple[int, int]]:
    """(start, end) of every array/object that opens at depth ``max_depth + 1``."""
    spans: list[tuple[int, int]] = []
    depth = 0
    start = -1
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        if token in "[{":
            depth += 1
            if depth == max_depth + 1:
                start = match.start()
        else:
            if depth == max_depth + 1 and start >= 0:
                spans.append((start, match.end()))
                start = -1
            depth -= 1
    if start >= 0:
        # Never closed: not JSON, and json.loads would recurse into it before noticing.
        raise ValueError(f"JSON nested deeper than {max_depth} levels and never closed")
    return spans


def loads(text: str, *, max_depth: int) -> Decoded:
    """``text`` decoded, with subtrees below ``max_depth`` levels replaced by ``null``.

    Raises ``ValueError`` for text that is not JSON.
    """
    spans = _deep_spans(text, max_depth)
    if not spans:
        return Decoded(json.loads(text), cut=False)
    pieces: list[str] = []
    end = 0
    for start, stop in spans:
        pieces += [text[end:start], "null"]
        end = stop
    pieces.append(text[end:])
    return Decoded(json.loads("".join(pieces)), cut=True)
