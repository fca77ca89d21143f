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

Negative quantities are rejected: every quantity in this API is a memory size.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Final

from pydantic import BeforeValidator, WithJsonSchema

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_QUANTITY_RE: Final = re.compile(
    rf"^\+?({_NUMBER})"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)

_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(ValueError):
    """A string that is not a valid non-negative Kubernetes quantity."""


def to_decimal(text: str) -> Decimal:
    """The exact value of a quantity string; raises :class:`QuantityError`."""
    match = _QUANTITY_RE.match(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a valid quantity (e.g. '512Mi', '1G', '1073741824')")
    try:
        number = Decimal(match[1])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{text!r} is not a valid quantity") from exc
    suffix = match[2] or ""
    if suffix in _BINARY:
        return number * (1 << _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    if suffix:
        return number.scaleb(int(suffix[1:]))
    return number


def to_bytes(text: str) -> int:
    """A quantity as whole bytes, rounded up like Kubernetes does for byte sizes."""
    return math.ceil(to_decimal(text))


def _validate(value: object) -> object:
    # Kubernetes accepts a plain JSON integer for a Quantity; keep the canonical string form.
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str):
        to_decimal(value)
    return value


_JSON_SCHEMA: Final = {
    "anyOf": [
        {"type": "string", "pattern": _QUANTITY_RE.pattern},
        {"type": "integer", "minimum": 0},
    ],
    "description": "Kubernetes quantity, e.g. '512Mi' or '1G'",
}

Quantity = Annotated[str, BeforeValidator(_validate), WithJsonSchema(_JSON_SCHEMA)]
"""A validated quantity string; JSON integers are accepted and stored as their decimal text."""
