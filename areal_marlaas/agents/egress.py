"""Where a tenant's tools and endpoint graders may connect.

A URL is checked when the job is created and again at every connection: its
host is resolved, and every address it resolves to must be allowed. By default
only public (globally routable) addresses are; private ranges, loopback,
link-local (the cloud metadata service at 169.254.169.254 among them), CGNAT,
multicast and reserved ones are refused unless the operator lists them (or a
hostname resolving there) in ``allow``. The connection then goes to the address
that was checked (the Host header and TLS SNI keep the name), so a DNS answer
that changes between the check and the connect cannot move it, and redirects
are never followed.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class EgressError(ValueError):
    """A URL a tenant may not reach from here; ``param`` names its field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Pinned:
    """A checked URL: send to ``url`` (the host replaced by the checked
    address), with ``host_header`` as the Host header and ``server_name`` as
    the TLS server name."""

    url: str
    host_header: str
    server_name: str
    address: str


def _networks(entries: tuple[str, ...]) -> tuple[tuple[IPNetwork, ...], frozenset]:
    nets, names = [], set()
    for e in entries:
        try:
            nets.append(ipaddress.ip_network(e, strict=False))
        except ValueError:
            names.add(e.lower().rstrip("."))
    return tuple(nets), frozenset(names)


def _plain(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def split_url(url: object, param: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL without credentials; the syntax
    only (where it may connect is ``EgressPolicy``'s question)."""
    if not isinstance(url, str) or not url:
        raise EgressError(f"{param} must be an http(s) URL.", param)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EgressError(
            f"{param} must be an http:// or https:// URL with a host, got {url!r}.",
            param,
        )
    if parts.username is not None or parts.password is not None:
        raise EgressError(
            f"{param}: credentials in the URL are not allowed; send them in headers.",
            param,
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise EgressError(f"{param}: bad port in {url!r} ({e}).", param) from None
    return parts.scheme, parts.hostname, port


@dataclass(frozen=True)
class EgressPolicy:
    allow: tuple[str, ...] = field(default=())
    only_allowed: bool = False

    def __post_init__(self):
        object.__setattr__(self, "allow", tuple(self.allow))

    def to_dict(self) -> dict:
        return {"allow": list(self.allow), "only_allowed": self.only_allowed}

    @classmethod
    def from_dict(cls, d: dict | None) -> EgressPolicy:
        d = d or {}
        return cls(tuple(d.get("allow", ())), bool(d.get("only_allowed", False)))

    def address_allowed(self, ip: IPAddress, host: str) -> bool:
        ip = _plain(ip)
        nets, names = _networks(self.allow)
        if any(ip.version == n.version and ip in n for n in nets):
            return True
        if host.lower().rstrip(".") in names:
            # A listed name may resolve to private addresses, not to link-local
            # ones (metadata services): those need an explicit network.
            return not ip.is_link_local
        return ip.is_global and not self.only_allowed

    def resolve(self, url: object, param: str) -> Pinned:
        """Check ``url`` and pick the address to connect to (blocking: DNS)."""
        _, host, port = split_url(url, param)
        assert isinstance(url, str)  # split_url checked it
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as e:
            raise EgressError(
                f"{param}: cannot resolve host {host!r} ({e}).", param
            ) from None
        addresses = list(dict.fromkeys(str(i[4][0]) for i in infos))
        if not addresses:
            raise EgressError(f"{param}: host {host!r} has no address.", param)
        for a in addresses:
            if not self.address_allowed(ipaddress.ip_address(a.split("%")[0]), host):
                raise EgressError(
                    f"{param}: host {host!r} resolves to {a}, a private, loopback, "
                    "link-local or reserved address this service does not connect "
                    "to; use a public endpoint, or ask the operator to allow it "
                    "(service.egress.allow).",
                    param,
                )
        address = addresses[0]
        parts = urlsplit(url)
        netloc = f"[{address}]" if ":" in address else address
        if parts.port:
            netloc += f":{parts.port}"
        pinned = urlunsplit(parts._replace(netloc=netloc))
        host_header = f"{host}:{parts.port}" if parts.port else host
        return Pinned(pinned, host_header, host, address)

    def check(self, url: object, param: str) -> None:
        self.resolve(url, param)
