"""Device selectors evaluated the way the scheduler does, fast enough for 10,000 devices.

Kubernetes evaluates a DRA selector against ``device`` with ``driver``, ``attributes`` and
``capacity`` maps keyed by domain (an unqualified attribute name belongs to the driver's
domain), capacities as quantities and version attributes as semantic versions. This module
builds the same view for cel-python, with the Kubernetes library functions a selector uses
(``quantity()``, ``semver()``, ``compareTo``, ``isGreaterThan``, ``isLessThan``, ...).

Why it is fast: each expression is parsed and compiled once, and most selectors read only a
few fields (``device.driver``, ``device.attributes['d'].name``, ``device.capacity['d'].name``).
When the syntax tree shows that ``device`` is used only that way, the result depends on those
values alone and is remembered per distinct tuple of values: 10,000 devices of a few models
cost a few real evaluations. Any other use of ``device`` (the whole map, a macro over it)
evaluates each device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

import celpy
import lark
from celpy import celparser, celtypes
from celpy.evaluation import CELEvalError
from lark.exceptions import LarkError

from dra_gpu.config.quantity import QuantityError, to_decimal
from dra_gpu.controller.selectors import device_accesses

Ref = tuple[str, str, str]  # (map, domain, name); ("driver", "", "") for device.driver
DRIVER_REF: Final[Ref] = ("driver", "", "")


class CelError(Exception):
    """A selector that does not compile, or fails at run time for a device (as the scheduler
    reports it: the claim cannot be allocated on that node)."""


@functools.total_ordering
@dataclass(frozen=True)
class Quantity:
    value: Decimal

    def __lt__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value < other.value


@functools.total_ordering
@dataclass(frozen=True)
class Semver:
    parts: tuple[int, int, int]
    text: str

    def __lt__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.parts < other.parts


def parse_quantity(text: str) -> Quantity:
    try:
        return Quantity(to_decimal(text))
    except QuantityError as err:
        raise CelError(f"quantity({text!r}): {err}") from err


def parse_semver(text: str) -> Semver:
    core = text.split("-", 1)[0].split("+", 1)[0]
    pieces = core.split(".")
    if len(pieces) != 3 or not all(p.isdigit() for p in pieces):
        raise CelError(f"semver({text!r}): not a semantic version MAJOR.MINOR.PATCH")
    major, minor, patch = (int(p) for p in pieces)
    return Semver((major, minor, patch), text)


def _compare(a: object, b: object) -> celtypes.IntType:
    if type(a) is not type(b) or not isinstance(a, Quantity | Semver):
        raise CelError(f"compareTo: cannot compare {_shown(a)} with {_shown(b)}")
    return celtypes.IntType((a > b) - (a < b))


def _shown(value: object) -> str:
    if isinstance(value, Semver):
        return f"semver({value.text!r})"
    if isinstance(value, Quantity):
        return f"quantity({value.value})"
    return repr(value)


def _as_integer(q: object) -> celtypes.IntType:
    if not isinstance(q, Quantity) or q.value != q.value.to_integral_value():
        raise CelError(f"asInteger: {_shown(q)} is not an integer quantity")
    return celtypes.IntType(int(q.value))


FUNCTIONS: Final[Mapping[str, Callable[..., Any]]] = {
    "quantity": lambda s: parse_quantity(str(s)),
    "semver": lambda s: parse_semver(str(s)),
    "isSemver": lambda s: celtypes.BoolType(_parses(parse_semver, str(s))),
    "isQuantity": lambda s: celtypes.BoolType(_parses(parse_quantity, str(s))),
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(int(_compare(a, b)) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(int(_compare(a, b)) < 0),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "major": lambda v: celtypes.IntType(v.parts[0]),
    "minor": lambda v: celtypes.IntType(v.parts[1]),
    "patch": lambda v: celtypes.IntType(v.parts[2]),
}


def _parses(parse: Callable[[str], object], text: str) -> bool:
    try:
        parse(text)
    except CelError:
        return False
    return True


def attribute_value(raw: Mapping[str, Any]) -> Any:
    """A published attribute (``{"string": ...}``, ``{"int": ...}``, ...) as a CEL value."""
    if "string" in raw:
        return celtypes.StringType(raw["string"])
    if "bool" in raw:
        return celtypes.BoolType(raw["bool"])
    if "int" in raw:
        return celtypes.IntType(raw["int"])
    if "version" in raw:
        return parse_semver(str(raw["version"]))
    raise CelError(f"attribute value {dict(raw)!r} has no known type")


def split_name(qualified: str, driver: str) -> tuple[str, str]:
    """``(domain, name)``: an unqualified attribute or capacity belongs to the driver."""
    domain, _, name = qualified.rpartition("/")
    return (domain or driver, name)


def plain_value(raw: Mapping[str, Any] | None) -> Any:
    """An attribute or capacity as shown to a person (``None`` when the device lacks it)."""
    if raw is None:
        return None
    for key in ("string", "bool", "int", "version", "value"):
        if key in raw:
            return raw[key]
    return dict(raw)


@dataclass(frozen=True)
class DeviceView:
    """What a selector may read of one published device."""

    driver: str
    attributes: Mapping[str, Mapping[str, Any]]  # as published: qualified or driver-relative
    capacity: Mapping[str, Mapping[str, Any]]

    def raw(self, ref: Ref) -> Any:
        """The published value a reference reads (``None`` when absent)."""
        if ref == DRIVER_REF:
            return self.driver
        which, domain, name = ref
        table = self.attributes if which == "attributes" else self.capacity
        for key in (f"{domain}/{name}", name) if domain == self.driver else (f"{domain}/{name}",):
            if key in table:
                return table[key]
        return None

    def activation(self, domains: frozenset[str]) -> celtypes.MapType:
        attrs: dict[str, dict[str, Any]] = {d: {} for d in domains}
        for key, raw in self.attributes.items():
            domain, name = split_name(key, self.driver)
            attrs.setdefault(domain, {})[name] = attribute_value(raw)
        caps: dict[str, dict[str, Any]] = {d: {} for d in domains}
        for key, raw in self.capacity.items():
            domain, name = split_name(key, self.driver)
            caps.setdefault(domain, {})[name] = parse_quantity(str(raw.get("value", "")))
        return celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(self.driver),
                celtypes.StringType("attributes"): _map_of_maps(attrs),
                celtypes.StringType("capacity"): _map_of_maps(caps),
            }
        )


def _map_of_maps(table: Mapping[str, Mapping[str, Any]]) -> celtypes.MapType:
    return celtypes.MapType(
        {
            celtypes.StringType(domain): celtypes.MapType(
                {celtypes.StringType(k): v for k, v in inner.items()}
            )
            for domain, inner in table.items()
        }
    )


def _device_idents(tree: lark.Tree[lark.Token]) -> int:
    return sum(
        1
        for node in tree.iter_subtrees()
        if node.data == "ident" and node.children and str(node.children[0]) == "device"
    )


def _driver_uses(tree: lark.Tree[lark.Token]) -> int:
    count = 0
    for node in tree.iter_subtrees():
        if node.data != "member_dot":
            continue
        receiver, field = node.children
        leaf = receiver
        while isinstance(leaf, lark.Tree) and len(leaf.children) == 1:
            leaf = leaf.children[0]
        if isinstance(leaf, lark.Token) and str(leaf) == "device" and str(field) == "driver":
            count += 1
    return count


def _references(tree: lark.Tree[lark.Token]) -> tuple[Ref, ...] | None:
    """The fields the expression reads, or None when it uses ``device`` in another way."""
    accesses = list(device_accesses(tree))
    drivers = _driver_uses(tree)
    if _device_idents(tree) != len(accesses) + drivers:
        return None
    refs: list[Ref] = [DRIVER_REF] if drivers else []
    for access in accesses:
        if access not in refs:
            refs.append(access)
    return tuple(refs)


@dataclass(frozen=True)
class Verdict:
    matches: bool
    error: str | None = None  # a CEL run-time error: the device cannot be judged


class Selector:
    """One CEL expression, compiled once; ``check(device)`` answers as the scheduler would."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        try:
            tree = celparser.CELParser().parse(expression)
            env = celpy.Environment()
            self._program = env.program(env.compile(expression), functions=dict(FUNCTIONS))
        except (celparser.CELParseError, LarkError) as err:
            # cel-python's own message clips the expression; name the whole of it instead.
            raise CelError(f"does not compile (CEL syntax error): {expression}") from err
        except CELEvalError as err:
            raise CelError(f"does not compile: {_first_line(err)}") from err
        self.references = _references(tree)
        refs = self.references or ()
        self._domains = frozenset(r[1] for r in refs if r != DRIVER_REF)
        self._memo: dict[tuple[Any, ...], Verdict] = {}

    def _key(self, device: DeviceView) -> tuple[Any, ...] | None:
        if self.references is None:
            return None
        return tuple(_hashable(device.raw(r)) for r in self.references)

    def check(self, device: DeviceView) -> Verdict:
        key = self._key(device)
        if key is not None and key in self._memo:
            return self._memo[key]
        verdict = self._evaluate(device)
        if key is not None:
            self._memo[key] = verdict
        return verdict

    def _evaluate(self, device: DeviceView) -> Verdict:
        try:
            result = self._program.evaluate({"device": device.activation(self._domains)})
        except CelError as err:
            return Verdict(False, str(err))
        except (CELEvalError, TypeError, ValueError, KeyError) as err:
            return Verdict(False, _first_line(err))
        if isinstance(result, celtypes.BoolType | bool):
            return Verdict(bool(result))
        return Verdict(False, f"the expression yields {type(result).__name__}, not bool")


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _first_line(err: BaseException) -> str:
    if isinstance(err, CELEvalError) and err.args:
        inner = err.args[0]
        # celpy wraps a failed && / || around the first real cause; show that cause.
        while isinstance(inner, tuple | list) and inner:
            inner = inner[0]
        text = str(inner)
    else:
        text = str(err)
    return text.splitlines()[0] if text else type(err).__name__


@functools.lru_cache(maxsize=1024)
def compiled(expression: str) -> Selector:
    """One compiled selector per distinct expression text, shared by every use."""
    return Selector(expression)
