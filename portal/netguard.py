"""Outbound HTTP to a URL a tenant chose (webhooks): allowed only when every address its host
resolves to is public, and the caller then connects to one of those checked addresses, so a
second lookup (DNS rebinding) cannot point the request inside the platform.

Django-free: the platform's allowances (`allowed`, CIDR networks) are passed in by the caller.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")
_NUMERIC_LOOKING = re.compile(r"[0-9a-fx.]+")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)


class Refused(ValueError):
    """The URL may not be reached; the message says why, in words fit for the tenant."""


class Unresolvable(Refused):
    """The host name has no address now (DNS failure, perhaps temporary)."""


@dataclass(frozen=True)
class Target:
    """A checked URL: where to connect (`addresses`, in resolver order) and what to send."""

    scheme: str
    host: str  # ASCII (IDNA) host name, or the canonical IP literal without brackets
    port: int
    path: str  # path and query, never empty; the fragment is never sent
    addresses: tuple[str, ...]

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    def url_for(self, address: str) -> str:
        """The URL with the host replaced by one of the checked addresses."""
        literal = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{literal}:{self.port}{self.path}"


def parse_networks(values: str | Iterable[str]) -> tuple[Network, ...]:
    """`"127.0.0.0/8,::1/128"` or a list of CIDR strings; ValueError names a bad entry."""
    items = values.split(",") if isinstance(values, str) else list(values)
    networks: list[Network] = []
    for item in (str(value).strip() for value in items):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not a CIDR network such as 10.0.0.0/8") from None
    return tuple(networks)


def _kind_v4(address: ipaddress.IPv4Address) -> str | None:
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address in _SHARED:
        return "a shared (carrier-grade NAT) address"
    if address.is_private:
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "a special-purpose address"
    return None


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo client, NAT64)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _kind_v6(address: ipaddress.IPv6Address) -> str | None:
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_site_local:
        return "a site-local address"
    if address.is_multicast:
        return "a multicast address"
    embedded = _embedded_v4(address)
    if embedded is not None:
        kind = _kind_v4(embedded)
        return None if kind is None else f"a form of {embedded}, {kind}"
    if address.is_private:
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "a special-purpose address"
    return None


def address_problem(address: Address, allowed: Sequence[Network] = ()) -> str | None:
    """Why the address may not be reached ("a loopback address"), or None when it may: it is
    public, or the platform allows its network (an IPv4-mapped IPv6 address counts as its
    IPv4 address)."""
    candidates: list[Address] = [address]
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        candidates.append(address.ipv4_mapped)
    if any(candidate in network for candidate in candidates for network in allowed):
        return None
    if isinstance(address, ipaddress.IPv4Address):
        return _kind_v4(address)
    return _kind_v6(address)


def resolve(host: str, port: int) -> list[str]:
    """The one name lookup of a check: the host's IPv4/IPv6 addresses, in resolver order."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise Unresolvable(f"{host} does not resolve ({reason}).") from None
    addresses: list[str] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in addresses:
            addresses.append(str(sockaddr[0]))
    if not addresses:
        raise Unresolvable(f"{host} has no IPv4 or IPv6 address.")
    return addresses


def _host_of(netloc_host: str) -> tuple[str, Address | None]:
    """The ASCII host and, for an IP literal, its address; refuses odd spellings."""
    if "%" in netloc_host:
        raise Refused("the host must not carry a zone index (%).")
    try:
        literal = ipaddress.ip_address(netloc_host)
    except ValueError:
        pass
    else:
        return str(literal), literal
    try:
        host = netloc_host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise Refused(f"{netloc_host!r} is not a valid host name.") from None
    if _NUMERIC_LOOKING.fullmatch(host):
        try:
            socket.inet_aton(host)
        except OSError:
            pass
        else:  # 2130706433, 0x7f000001, 017700000001, 127.1: resolvers read these as IPv4
            raise Refused(
                f"{host} is an IPv4 address in a non-standard form; write it as four "
                "decimal numbers, such as 203.0.113.7."
            )
    if len(host) > 253 or not _HOST_NAME.fullmatch(host):
        raise Refused(f"{netloc_host!r} is not a valid host name.")
    return host, None


def check_url(url: str, *, allowed: Sequence[Network] = (), what: str = "requests") -> Target:
    """Parse `url`, resolve its host once and check every address; the Target says where to
    connect. Refused (or Unresolvable) says why not, in a sentence naming the address."""
    if any(char.isspace() or ord(char) < 32 or ord(char) == 127 for char in url):
        raise Refused("the URL must not contain spaces or control characters.")
    try:
        parts = urlsplit(url)
    except ValueError:  # an unbalanced [ or ] in the host
        raise Refused("the URL is not well formed.") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise Refused("only http and https URLs are allowed.")
    if "@" in parts.netloc:
        raise Refused("the URL must not carry a user name or password.")
    if "\\" in parts.netloc:
        raise Refused("the host must not contain a backslash.")
    if not parts.hostname:
        raise Refused("the URL needs a host.")
    try:
        port = parts.port
    except ValueError:
        raise Refused("the port must be a number from 1 to 65535.") from None
    if port == 0:
        raise Refused("the port must be a number from 1 to 65535.")
    host, literal = _host_of(parts.hostname)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    port = port or DEFAULT_PORTS[scheme]
    addresses = [host] if literal is not None else resolve(host, port)
    for address in addresses:
        problem = address_problem(ipaddress.ip_address(address), allowed)
        if problem is not None:
            where = f"{host} resolves to {address},"
            if literal is not None:
                where = f"{parts.hostname} is"
            raise Refused(f"{where} {problem}; {what} must reach a public address.")
    return Target(scheme=scheme, host=host, port=port, path=path, addresses=tuple(addresses))
