"""Find attribute and capacity names in CEL selectors that this driver never publishes.

A selector such as ``device.attributes['gpu.nvidia.com'].productname == 'NVIDIA H200'`` is valid
CEL and the API server accepts it, but it can never match one of our devices (the attribute is
``productName``): the claim would just stay pending. The webhook therefore flags such names.

The expression is parsed with cel-python; the syntax tree is searched for accesses of the form
``device.attributes[<domain>].<name>`` or ``device.attributes[<domain>]['<name>']`` (same for
``capacity``) where ``<domain>`` is the string literal ``gpu.nvidia.com``. Other domains are
other drivers' business and are never flagged. An expression cel-python cannot parse yields no
warning: the API server has already validated it, and a false warning is worse than none.

The names come from the device model (:mod:`dra_gpu.devices.model`), so they cannot drift from
what the plugin publishes.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

import lark
from celpy import celparser
from lark.exceptions import LarkError

from dra_gpu import DRIVER_NAME

DOMAIN: Final = DRIVER_NAME  # a driver qualifies its own attributes with its name
_STRING_LITERAL: Final = re.compile(r"""^[rR]?(?P<q>'''|\"\"\"|'|")(?P<body>.*)(?P=q)$""", re.S)


@dataclass(frozen=True)
class PublishedNames:
    """Unprefixed names the driver publishes in its own domain, over all device types."""

    attributes: frozenset[str]
    capacities: frozenset[str]
    # Attributes published under another domain (``pciBusID`` -> ``resource.kubernetes.io``).
    elsewhere: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class NameUse:
    """One ``device.<map>['gpu.nvidia.com'].<name>`` access found in an expression."""

    map: str  # "attributes" or "capacity"
    name: str


def _own_domain(names: Iterable[str]) -> frozenset[str]:
    out = set()
    for name in names:
        domain, _, short = name.rpartition("/")
        if domain in ("", DOMAIN):
            out.add(short)
    return frozenset(out)


@functools.cache
def published_names() -> PublishedNames:
    """What the device model publishes (full GPUs and MIG devices together)."""
    from dra_gpu.devices import model  # the device model is the single source of the names

    return PublishedNames(
        attributes=_own_domain(model.ATTRIBUTE_NAMES),
        capacities=_own_domain(model.CAPACITY_NAMES),
        elsewhere={
            short: domain
            for domain, _, short in (n.rpartition("/") for n in model.ATTRIBUTE_NAMES)
            if domain not in ("", DOMAIN)
        },
    )


def _single_chain_leaf(
    node: lark.Tree[lark.Token] | lark.Token,
) -> lark.Tree[lark.Token] | lark.Token:
    # expr -> conditionalor -> ... -> primary -> literal: follow nodes with one child.
    while isinstance(node, lark.Tree) and len(node.children) == 1:
        node = node.children[0]
    return node


def _string_literal(node: lark.Tree[lark.Token] | lark.Token) -> str | None:
    leaf = _single_chain_leaf(node)
    if not isinstance(leaf, lark.Token):
        return None
    match = _STRING_LITERAL.match(str(leaf))
    # Escapes are irrelevant for domain and identifier-like names; a body with any is ignored.
    if match is None or "\\" in match["body"]:
        return None
    return match["body"]


def _is_device_map(node: lark.Tree[lark.Token]) -> str | None:
    """``attributes``/``capacity`` when ``node`` is ``device.attributes`` or ``device.capacity``."""
    inner = _single_chain_leaf(node)
    if not (isinstance(inner, lark.Tree) and inner.data == "member_dot"):
        return None
    receiver, field = inner.children
    root = _single_chain_leaf(receiver)
    if (
        isinstance(root, lark.Token)
        and str(root) == "device"
        and str(field) in ("attributes", "capacity")
    ):
        return str(field)
    return None


def _device_map_domain(node: lark.Tree[lark.Token] | lark.Token) -> tuple[str, str] | None:
    """``(map, domain)`` when ``node`` is ``device.<map>['<domain>']`` with a literal domain."""
    inner = _single_chain_leaf(node)
    if not (isinstance(inner, lark.Tree) and inner.data == "member_index"):
        return None
    receiver, index = inner.children
    domain = _string_literal(index)
    if not isinstance(receiver, lark.Tree) or domain is None:
        return None
    which = _is_device_map(receiver)
    return None if which is None else (which, domain)


def device_accesses(tree: lark.Tree[lark.Token]) -> Iterator[tuple[str, str, str]]:
    """``(map, domain, name)`` for each ``device.<map>['<domain>'].<name>`` (or ``['<name>']``)."""
    for node in tree.iter_subtrees():
        if node.data not in ("member_dot", "member_index"):
            continue
        receiver, key = node.children
        found = _device_map_domain(receiver)
        if found is None:
            continue
        name = str(key) if node.data == "member_dot" else _string_literal(key)
        if name is not None:
            yield found[0], found[1], name


def name_uses(expression: str) -> Iterator[NameUse]:
    """Every access of a name in this driver's domain; nothing when the expression won't parse."""
    try:
        tree = celparser.CELParser().parse(expression)
    except (celparser.CELParseError, LarkError):
        return
    for which, domain, name in device_accesses(tree):
        if domain == DOMAIN:
            yield NameUse(which, name)


def _suggest(name: str, candidates: frozenset[str]) -> str | None:
    by_lower = {c.lower(): c for c in candidates}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    if close:
        return close[0]
    close = difflib.get_close_matches(name.lower(), sorted(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


def _warning(use: NameUse, names: PublishedNames) -> str | None:
    own, other = (
        (names.attributes, names.capacities)
        if use.map == "attributes"
        else (names.capacities, names.attributes)
    )
    if use.name in own:
        return None
    kind = "attribute" if use.map == "attributes" else "capacity"
    if use.name in other:
        right_map, right_kind = (
            ("capacity", "capacity") if use.map == "attributes" else ("attributes", "attribute")
        )
        return (
            f"{DOMAIN} publishes {use.name!r} as {right_kind}: "
            f"use device.{right_map}['{DOMAIN}'].{use.name}"
        )
    if use.map == "attributes" and use.name in names.elsewhere:
        domain = names.elsewhere[use.name]
        return (
            f"{use.name!r} is published in domain {domain!r}, not {DOMAIN!r}: "
            f"use device.attributes['{domain}'].{use.name}"
        )
    suggestion = _suggest(use.name, own)
    hint = f"; did you mean {suggestion!r}?" if suggestion else ""
    return f"{DOMAIN} never publishes {kind} {use.name!r}{hint}"


def unknown_name_warnings(expression: str) -> list[str]:
    """One message per distinct unpublished name the expression uses, in order of appearance."""
    return list(_warnings(expression))


# Parsing is most of an admission's cost, and claims stamped from one template carry the same
# selectors on every write: recent answers are kept. Bounded, since the text is the user's.
@functools.lru_cache(maxsize=256)
def _warnings(expression: str) -> tuple[str, ...]:
    names = published_names()
    out: list[str] = []
    for use in name_uses(expression):
        msg = _warning(use, names)
        if msg is not None and msg not in out:
            out.append(msg)
    return tuple(out)
