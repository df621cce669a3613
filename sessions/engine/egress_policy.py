"""The per-run egress policy: which destinations a run's browser may reach (no Django imports).

``EgressPolicy`` judges every destination before a connection is opened: a name against the
workflow's allowlist before it is resolved, then every address it resolves to against what is
never reachable (cloud metadata, link-local) and what is internal. The run's proxy
(``sessions.engine.proxy.EgressProxy``) asks it about each request and connects to exactly the
address it vetted.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workflows.hosts import HostPattern, host_allowed, normalize_host, parse_host_pattern

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

# Cloud metadata services hand out credentials to whoever asks from inside the machine; no
# workflow has a reason to reach them, so no allowlist entry can open them.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack
        ipaddress.ip_address("169.254.170.2"),  # AWS ECS task credentials
        ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
    }
)

_LABEL = r"(?!-)[a-z0-9_-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


class EgressDenied(Exception):
    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.reason)
        self.decision = decision


def getaddrinfo_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver returns for ``host``, in its order, without duplicates."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address ``host`` spells, or None when it is a name.

    Anything the C library would take as an IPv4 address counts (``2130706433``, ``0x7f.1``,
    ``127.1``, ``0177.0.0.1``): a browser or an HTTP library may connect to it as such, so the
    policy must not mistake it for a name that merely failed to match.
    """
    text = normalize_host(host)
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if not text or not text.isascii() or any(ch.isspace() for ch in text):
        return None
    try:
        packed = socket.inet_aton(text)
    except OSError:
        return None
    return ipaddress.IPv4Address(packed)


class EgressPolicy:
    """Decides whether a run may open a connection to ``host:port``.

    Names are judged before they are resolved, so a name outside the allowlist never reaches a
    DNS server (a lookup alone can leak data). Allowed names must resolve to public addresses only,
    which stops DNS rebinding onto the machine's own network; internal services are reached by
    allowlisting their IP literally.
    """

    def __init__(
        self,
        allowed: Sequence[str | HostPattern],
        *,
        resolver: Resolver = getaddrinfo_resolver,
    ) -> None:
        self.patterns: list[HostPattern] = [
            p if isinstance(p, HostPattern) else parse_host_pattern(p) for p in allowed
        ]
        self._resolver = resolver

    def decide(self, host: str, port: int) -> Decision:
        decision, _ = self._evaluate(host, port)
        return decision

    def resolve_for_connect(self, host: str, port: int) -> str:
        """The address to connect to for ``host:port``; raises ``EgressDenied`` if refused.

        The proxy connects to this address rather than to the name, so the address that was
        vetted is the one reached.
        """
        decision, addresses = self._evaluate(host, port)
        if not decision.allowed:
            raise EgressDenied(decision)
        return addresses[0]

    def _evaluate(self, host: str, port: int) -> tuple[Decision, list[str]]:
        name = normalize_host(host)
        if not name:
            return _deny("the request names no host"), []
        if not 1 <= port <= 65535:
            return _deny(f"port {port} is not a valid port"), []
        ip = parse_ip_literal(name)
        if ip is not None:
            return self._evaluate_ip(ip, port), [str(ip)]
        if not _HOSTNAME.match(name):
            return _deny(f"{name!r} is not a valid host name"), []
        if not host_allowed(name, port, self.patterns):
            return _deny(f"{name} is not in this workflow's allowed hosts"), []
        return self._evaluate_resolved(name, port)

    def _evaluate_ip(self, ip: IPAddress, port: int) -> Decision:
        never = _never_reachable(ip)
        if never:
            return _deny(never)
        for pattern in self.patterns:
            if pattern.wildcard or pattern.port not in (None, port):
                continue
            if parse_ip_literal(pattern.host) == ip:
                return Decision(True, f"{hostport(str(ip), port)} is in the allowed hosts")
        return _deny(f"raw IP address {ip} is not in the allowed hosts")

    def _evaluate_resolved(self, name: str, port: int) -> tuple[Decision, list[str]]:
        try:
            raw = self._resolver(name, port)
        except (OSError, UnicodeError, ValueError) as exc:
            return _deny(f"{name} could not be resolved ({exc})"), []
        addresses: list[IPAddress] = []
        for text in raw:
            try:
                addresses.append(ipaddress.ip_address(text))
            except ValueError:
                return _deny(f"{name} resolved to {text!r}, which is not an IP address"), []
        if not addresses:
            return _deny(f"{name} did not resolve to any address"), []
        explicit_localhost = name == "localhost" and any(
            p.host == "localhost" and not p.wildcard for p in self.patterns
        )
        for ip in addresses:
            never = _never_reachable(ip)
            if never:
                return _deny(f"{name} resolves to {ip}: {never}"), []
            unwrapped = _unwrap(ip)
            if explicit_localhost and unwrapped.is_loopback:
                continue
            internal = _internal_kind(unwrapped)
            if internal:
                return _deny(
                    f"{name} resolves to {ip}, a {internal} address; internal addresses are "
                    "reachable only when allowlisted by IP"
                ), []
        reason = f"{hostport(name, port)} is in the allowed hosts"
        return Decision(True, reason), [str(ip) for ip in addresses]


def _deny(reason: str) -> Decision:
    return Decision(False, reason)


def hostport(host: str, port: int) -> str:
    """``host:port`` as a message names it, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _unwrap(ip: IPAddress) -> IPAddress:
    # ::ffff:169.254.169.254 reaches the same socket as 169.254.169.254 on a dual-stack host.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _never_reachable(ip: IPAddress) -> str | None:
    unwrapped = _unwrap(ip)
    if unwrapped.is_link_local:
        return f"{ip} is a link-local address (cloud metadata) and is never reachable"
    if ip in METADATA_ADDRESSES or unwrapped in METADATA_ADDRESSES:
        return f"{ip} is a cloud metadata address and is never reachable"
    return None


def _internal_kind(ip: IPAddress) -> str | None:
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        # e.g. 100.64.0.0/10 (carrier-grade NAT): not public, so not for a rebound name either.
        return "non-public"
    return None
