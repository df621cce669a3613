"""Egress allowlist patterns: parsing and matching (no Django imports).

A pattern is a host name, an explicit wildcard ``*.example.com`` (subdomains only, never the apex),
an IPv4 literal or a bracketed IPv6 literal, each with an optional ``:port``. Without a port,
a pattern admits any port. Host names compare case-insensitively without a trailing dot.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")


class HostPatternError(ValueError):
    pass


@dataclass(frozen=True)
class HostPattern:
    host: str
    port: int | None
    wildcard: bool

    def __str__(self) -> str:
        host = f"*.{self.host}" if self.wildcard else self.host
        if ":" in self.host:
            host = f"[{self.host}]"
        return host if self.port is None else f"{host}:{self.port}"

    def matches(self, host: str, port: int | None) -> bool:
        host = normalize_host(host)
        if self.port is not None and port != self.port:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host


def normalize_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def parse_host_pattern(raw: str) -> HostPattern:
    text = raw.strip()
    if not text:
        raise HostPatternError("a host pattern cannot be empty")
    if "://" in text or "/" in text:
        raise HostPatternError(
            f"'{raw}' is a URL; write the host name only (e.g. portal.example.com)"
        )
    port: int | None = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise HostPatternError(f"'{raw}' is not a valid [IPv6]:port")
            port = _parse_port(raw, rest[1:])
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        port = _parse_port(raw, port_text)
    elif ":" in text:
        raise HostPatternError(f"'{raw}': write IPv6 addresses in brackets, e.g. [::1]:8001")
    else:
        host = text
    host = normalize_host(host)
    wildcard = host.startswith("*.")
    if wildcard:
        host = host[2:]
    if "*" in host:
        raise HostPatternError(f"'{raw}': only a leading '*.' wildcard is allowed")
    if _is_ip(host):
        if wildcard:
            raise HostPatternError(f"'{raw}': an IP address cannot have a wildcard")
    elif not _HOSTNAME.match(host):
        raise HostPatternError(f"'{raw}' is not a valid host name")
    elif wildcard and "." not in host:
        raise HostPatternError(f"'{raw}': a wildcard needs a domain with a dot, e.g. *.example.com")
    return HostPattern(host=host, port=port, wildcard=wildcard)


def host_allowed(host: str, port: int | None, patterns: list[HostPattern]) -> bool:
    return any(pattern.matches(host, port) for pattern in patterns)


def _parse_port(raw: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise HostPatternError(f"'{raw}': the port must be a number from 1 to 65535")
    return int(text)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
