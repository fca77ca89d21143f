"""The few link and address changes a local node needs, spoken over rtnetlink directly.

The harness used to run the ``ip`` command; GPU machines (and minimal hosts) often lack it, and the
kernel interface is small and stable. Only what a node needs is here: add a port-less bridge, put
an IPv4 address on it, bring it up, delete it, and list the host's IPv4 addresses. Every request
asks for an acknowledgement, so a refusal surfaces as ``OSError`` with the kernel's errno.

Message layouts (``linux/rtnetlink.h``, ``linux/if_link.h``, ``linux/if_addr.h``): a 16-byte
``nlmsghdr``, then ``ifinfomsg`` (16 bytes) or ``ifaddrmsg`` (8 bytes), then attributes (a 4-byte
length+type header, the payload, padding to 4 bytes).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator

_RTM_NEWLINK, _RTM_DELLINK = 16, 17
_RTM_NEWADDR, _RTM_GETADDR = 20, 22
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE, _NLM_F_DUMP = 1, 4, 0x200, 0x400, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_IFLA_IFNAME, _IFLA_LINKINFO, _IFLA_INFO_KIND = 3, 18, 1
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_IFF_UP = 1
_NLA_F_NESTED = 0x8000
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _ifinfo(index: int = 0, *, flags: int = 0, change: int = 0) -> bytes:
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, flags, change)


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _flags, _seq, _pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            return
        yield kind, data[offset + _HEADER.size : offset + length]
        offset += (length + 3) & ~3


def _attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            return
        yield kind & ~_NLA_F_NESTED, data[offset + 4 : offset + length]
        offset += (length + 3) & ~3


class _Socket:
    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.bind((0, 0))
        self._seq = 0

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()

    def _send(self, kind: int, flags: int, body: bytes) -> int:
        self._seq += 1
        header = _HEADER.pack(_HEADER.size + len(body), kind, _NLM_F_REQUEST | flags, self._seq, 0)
        self._sock.send(header + body)
        return self._seq

    def request(self, kind: int, flags: int, body: bytes) -> None:
        """Send one request and wait for its acknowledgement; a refusal raises ``OSError``."""
        self._send(kind, flags | _NLM_F_ACK, body)
        while True:
            for msg_kind, payload in _messages(self._sock.recv(65536)):
                if msg_kind == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", payload)
                    if code:
                        raise OSError(-code, os.strerror(-code))
                    return

    def dump(self, kind: int, body: bytes) -> Iterator[tuple[int, bytes]]:
        self._send(kind, _NLM_F_DUMP, body)
        while True:
            for msg_kind, payload in _messages(self._sock.recv(65536)):
                if msg_kind == _NLMSG_DONE:
                    return
                if msg_kind == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", payload)
                    raise OSError(-code, os.strerror(-code))
                yield msg_kind, payload


def _index(name: str) -> int:
    try:
        return socket.if_nametoindex(name)
    except OSError:
        raise OSError(errno.ENODEV, f"no network interface {name!r}") from None


def add_bridge(name: str) -> None:
    """Create a bridge interface ``name`` (fails with EEXIST if one is there)."""
    linkinfo = _attr(_IFLA_INFO_KIND, b"bridge")
    body = (
        _ifinfo()
        + _attr(_IFLA_IFNAME, name.encode() + b"\0")
        + _attr(_IFLA_LINKINFO | _NLA_F_NESTED, linkinfo)
    )
    with _Socket() as nl:
        nl.request(_RTM_NEWLINK, _NLM_F_CREATE | _NLM_F_EXCL, body)


def set_up(name: str) -> None:
    with _Socket() as nl:
        nl.request(_RTM_NEWLINK, 0, _ifinfo(_index(name), flags=_IFF_UP, change=_IFF_UP))


def add_ipv4(name: str, address: str, prefix: int) -> None:
    packed = socket.inet_aton(address)
    body = struct.pack("=BBBBI", socket.AF_INET, prefix, 0, 0, _index(name))
    body += _attr(_IFA_LOCAL, packed) + _attr(_IFA_ADDRESS, packed)
    with _Socket() as nl:
        nl.request(_RTM_NEWADDR, _NLM_F_CREATE | _NLM_F_EXCL, body)


def delete_link(name: str) -> bool:
    """Delete interface ``name``; False if there was none."""
    try:
        index = _index(name)
    except OSError:
        return False
    with _Socket() as nl:
        try:
            nl.request(_RTM_DELLINK, 0, _ifinfo(index))
        except OSError as e:
            if e.errno == errno.ENODEV:
                return False
            raise
    return True


def ipv4_addresses() -> list[str]:
    """Every IPv4 address configured on this host's interfaces."""
    found: list[str] = []
    with _Socket() as nl:
        for _kind, payload in nl.dump(
            _RTM_GETADDR, struct.pack("=BBBBI", socket.AF_INET, 0, 0, 0, 0)
        ):
            attrs = dict(_attrs(payload[8:]))
            raw = attrs.get(_IFA_LOCAL) or attrs.get(_IFA_ADDRESS)
            if raw is not None and len(raw) == 4:
                found.append(socket.inet_ntoa(raw))
    return found
