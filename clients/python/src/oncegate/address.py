"""A gate's address as every client takes it, read in one place: ``host:port`` and
``http://host:port`` (plaintext HTTP/2), ``https://host:port`` (TLS), ``unix:<path>`` (a gate's
admin socket on this machine), the forms the CLI (``oncegate call --server``) and the TypeScript
and Rust clients take too. grpcio's own name-resolver targets (``dns:///host:port`` for
client-side balancing, ``ipv4:``, ``ipv6:``) are passed to grpcio as they are. Anything else is
refused with a :class:`ValueError` naming the forms, in one sentence.

The environment names a gate's address twice: :data:`TARGET_ENV` the worker's (a
:class:`~oncegate.Gate` made without one), :data:`ADMIN_TARGET_ENV` the operator's (a
:class:`~oncegate.Resolver` made without one), as for the CLI; their earlier names are still read,
with a :class:`FutureWarning` naming the new one.

Owns the parsing only; the channels (:mod:`oncegate.channel`, :mod:`oncegate.aio.channel`) open
what it reads, and :func:`oncegate.native.endpoint` decides which ones the native core serves.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Literal

import grpc

__all__ = [
    "ADMIN_TARGET_ENV",
    "DEFAULT",
    "FORMS",
    "TARGET_ENV",
    "Address",
    "credentials",
    "from_environment",
    "parse",
]

FORMS = "host:port, http://host:port, https://host:port (TLS) or unix:<path> (a gate's admin socket)"
"""The forms an address may take, as every refusal names them (the CLI's and the Rust client's
sentence too)."""

TARGET_ENV = "ONCEGATE_TARGET"
"""The environment variable naming the worker's gate (``oncegate call``, ``oncegate mcp``, the
clients, the examples)."""

ADMIN_TARGET_ENV = "ONCEGATE_ADMIN_TARGET"
"""The environment variable naming the operator's gate (``oncegate admin``, the resolvers): often
its admin socket, ``unix:<data-dir>/admin.sock``."""

DEFAULT = "127.0.0.1:50051"
"""The address without any: a gate on this machine on its default port."""

_OLD_NAMES = {TARGET_ENV: ("ONCEGATE_SERVER", "ONCEGATE_GATE"), ADMIN_TARGET_ENV: ("ONCEGATE_SERVER",)}

_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):\d{1,5}$")
_RESOLVERS = ("dns:", "ipv4:", "ipv6:")


@dataclass(frozen=True)
class Address:
    """A gate's address, read."""

    kind: Literal["tcp", "tls", "unix", "resolver"]
    """``tcp``: ``host:port`` or ``http://host:port``; ``tls``: ``https://host:port``; ``unix``: a
    Unix socket; ``resolver``: a grpcio name-resolver target."""
    target: str
    """What grpcio is given: ``host:port``, ``unix:<path>``, or the resolver target as written."""
    plain: bool = False
    """Written ``http://``: plaintext, so TLS credentials are refused."""


def parse(given: str) -> Address:
    """``given`` read as a gate's address; a :class:`ValueError` naming :data:`FORMS` when it is
    none of them."""
    text = given.strip()
    if text.startswith("unix:"):
        path = text[len("unix://") :] if text.startswith("unix://") else text[len("unix:") :]
        if path:
            return Address("unix", f"unix:{path}")
    elif text.startswith(_RESOLVERS):
        return Address("resolver", text)
    else:
        scheme, sep, rest = text.partition("://")
        if not sep:
            scheme, rest = "", text
        authority = rest[:-1] if rest.endswith("/") else rest
        if _HOST_PORT.match(authority) and int(authority.rsplit(":", 1)[1]) <= 65535:
            match scheme.lower():
                case "":
                    return Address("tcp", authority)
                case "http":
                    return Address("tcp", authority, plain=True)
                case "https":
                    return Address("tls", authority)
    raise ValueError(f"{given!r} is not a gate address: give {FORMS}")


def credentials(address: Address, given: grpc.ChannelCredentials | None) -> grpc.ChannelCredentials | None:
    """The TLS credentials a channel to ``address`` opens with: ``given``; for ``https://`` without
    any, the system's roots; an ``http://`` address given credentials is refused (it says
    plaintext)."""
    if address.plain and given is not None:
        raise ValueError(
            f"'http://{address.target}' is plaintext, yet TLS credentials are given: give https://{address.target}"
        )
    if address.kind == "tls" and given is None:
        return grpc.ssl_channel_credentials()
    return given


def from_environment(*, admin: bool = False) -> str:
    """The gate's address when none is given: :data:`ADMIN_TARGET_ENV` (``admin``) or
    :data:`TARGET_ENV`, else an earlier name of it (with a :class:`FutureWarning`), else
    :data:`DEFAULT`."""
    name = ADMIN_TARGET_ENV if admin else TARGET_ENV
    for var in (name, *_OLD_NAMES[name]):
        value = os.environ.get(var, "").strip()
        if value:
            if var != name:
                warnings.warn(f"{var} is deprecated: set {name} instead", FutureWarning, stacklevel=3)
            return value
    return DEFAULT
