"""Kubernetes resource quantities (``resource.Quantity``) as they appear in opaque configs.

Only the grammar and an exact conversion to an integer number of bytes are needed here: MPS
memory limits are written by users as ``"1Gi"``/``"500M"`` and must be turned into the
megabyte figures the MPS control daemon takes. Values are kept as the user's string in the
models (so a config round-trips unchanged) and converted only on use.

Grammar (from the Kubernetes API conventions)::

    <quantity>  ::= <signedNumber><suffix>
    <suffix>    ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>  ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI> ::= m | "" | k | M | G | T | P | E       (n and u are accepted too)
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>

Bounds: every quantity in this API is a memory size, so a negative one is refused ("must not be
negative"), and so is one above ``2^63 - 1``, the largest value Kubernetes itself represents
(``1e999999`` would otherwise pass and reach the container environment). The whole string must
match: a trailing newline is not whitespace to ignore but a different value.
"""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal
from typing import Annotated, Final

from pydantic import BeforeValidator, WithJsonSchema

from dra_gpu.config.shown import shown

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_QUANTITY_RE: Final = re.compile(
    rf"^\+?({_NUMBER})"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)

_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

MAX_VALUE: Final = 2**63 - 1
MIB: Final = 2**20
# Beyond this many decimal digits (2^63 has 19) a value is too large whatever its digits are;
# checked before any arithmetic, so a huge exponent costs nothing.
_MAX_DIGITS: Final = 20


class QuantityError(ValueError):
    """A string that is not a valid non-negative Kubernetes quantity."""


def _exponent(digits: str) -> int:
    # An exponent of more than 7 digits is far outside any bound; clamp it rather than build a
    # huge int (Python refuses int() of over 4300 digits).
    sign = -1 if digits.startswith("-") else 1
    magnitude = digits.lstrip("+-")
    return sign * (int(magnitude) if len(magnitude) <= 7 else 10**7)


def to_decimal(text: str) -> Decimal:
    """The exact value of a quantity string; raises :class:`QuantityError`."""
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        if text.startswith("-") and _QUANTITY_RE.fullmatch(text[1:]):
            raise QuantityError(f"must not be negative, got {shown(text)}")
        raise QuantityError(
            f"{shown(text)} is not a valid quantity (e.g. '512Mi', '1G', '1073741824')"
        )
    number = Decimal(match[1])
    suffix = match[2] or ""
    if number == 0:
        return Decimal(0)
    if suffix in _BINARY:
        scale = _BINARY[suffix] * math.log10(2)
    elif suffix in _DECIMAL:
        scale = _DECIMAL[suffix]
    else:
        scale = _exponent(suffix[1:]) if suffix else 0
    if number.adjusted() + scale > _MAX_DIGITS:
        raise QuantityError(f"must be at most {MAX_VALUE} (8Ei - 1), got {shown(text)}")
    # Exact: the precision covers every digit written (the default 28 would round), and the
    # exponent range covers any clamped exponent.
    exact = Context(prec=len(number.as_tuple().digits) + 20, Emin=-(10**8), Emax=10**8)
    if suffix in _BINARY:
        value = number.fma(1 << _BINARY[suffix], 0, context=exact)
    else:
        value = number.scaleb(int(scale), context=exact)
    if value > MAX_VALUE:
        raise QuantityError(f"must be at most {MAX_VALUE} (8Ei - 1), got {shown(text)}")
    return value


def to_bytes(text: str) -> int:
    """A quantity as whole bytes, rounded up like Kubernetes does for byte sizes."""
    return math.ceil(to_decimal(text))


def _as_text(value: object) -> object:
    # Kubernetes accepts a plain JSON number for a Quantity (it parses the number's text); keep
    # a string form. A float's repr is the shortest text that reads back as the same number.
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > 64:  # str() of a huge int is itself refused, so say it here
            raise QuantityError(f"must be at most {MAX_VALUE} (8Ei - 1), got {shown(value)}")
        return str(value)
    return value


def _validate_memory_limit(value: object) -> object:
    value = _as_text(value)
    if isinstance(value, str) and to_bytes(value) < MIB:
        # The MPS control daemon takes whole MiB; NVIDIA's driver refuses a limit that rounds
        # down to 0 there, so do the same here, where the user still sees the error.
        raise QuantityError(
            f"must be at least 1Mi (the MPS daemon counts in MiB), got {shown(value)}"
        )
    return value  # anything but a string is left to the str type's own error


_MEMORY_LIMIT_JSON_SCHEMA: Final = {
    "anyOf": [
        {"type": "string", "pattern": _QUANTITY_RE.pattern},
        {"type": "number", "minimum": MIB, "maximum": MAX_VALUE},
    ],
    "description": "Kubernetes quantity of at least 1Mi, e.g. '512Mi' or '1G'",
}

MemoryLimit = Annotated[
    str, BeforeValidator(_validate_memory_limit), WithJsonSchema(_MEMORY_LIMIT_JSON_SCHEMA)
]
"""An MPS pinned-memory limit: a quantity of at least 1 MiB, kept as the user's string (a JSON
number is accepted, as Kubernetes does, and stored as its text)."""
