"""What a guest may reach over ``wasi:http``: frozen grants and limits with safe defaults.

Nothing is reachable unless an :class:`HttpGrant` names its origin. A grant is an origin
pattern (scheme, host with an optional leading ``*.`` wildcard, a port or ``*``), optionally the
methods allowed, the headers the host injects from a secret (:class:`Secret`), and whether the
origin may resolve to a private, loopback or link-local address.

Private addresses: a grant whose host is an IP literal or ``localhost`` names its address
explicitly, so ``http://127.0.0.1:8080`` reaches loopback without more; a DNS name reaches a
private address only with ``allow_private=True``. The check is made on every address the name
resolves to, when the connection is made (so a name that resolves to 127.0.0.1 or
169.254.169.254 is refused), and the host never follows a redirect itself: each hop is a new
request the guest makes, checked again.

Rejected: a global "network on" switch (``Policy.network`` stays the socket switch and grants
nothing here), and regular expressions as patterns (an allow-list must be readable at a glance,
and ``*.`` wildcards are what Spin and Extism users know).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Literal

from mighty._errors import BadInput

__all__ = [
    "DEFAULT_HTTP_LIMITS",
    "HttpGrant",
    "HttpLimits",
    "HttpPolicy",
    "Origin",
    "Secret",
    "is_private_address",
]

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*$")
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_SCHEMES = ("http", "https")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_private_address(address: str) -> bool:
    """Whether ``address`` (an IP literal) is anything but a public unicast address: loopback,
    private (RFC 1918, unique local), link-local (169.254.0.0/16: cloud metadata), shared,
    multicast, reserved or unspecified. IPv4-mapped IPv6 addresses are judged as IPv4."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def _ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Origin:
    """An origin pattern: ``https://api.example.com``, ``https://*.example.com:*``,
    ``http://127.0.0.1:8080``, ``http://[::1]:8080``. No port means the scheme's default."""

    scheme: Literal["http", "https"]
    host: str
    """Lower-case; a leading ``*.`` matches any subdomain (not the bare domain); IPv6 bare."""
    port: int | None
    """None: any port (``*``)."""

    @classmethod
    def parse(cls, text: str) -> Origin:
        """Parse ``scheme://host[:port|:*]``; :class:`BadInput` says what is wrong."""
        if not isinstance(text, str) or len(text) > 300:
            raise BadInput(f"an HTTP origin must be a string of at most 300 characters: {text!r}")
        scheme, sep, rest = text.strip().partition("://")
        scheme = scheme.lower()
        if not sep or scheme not in _SCHEMES:
            raise BadInput(f"HTTP origin {text!r} must start with http:// or https://")
        rest = rest.rstrip("/")
        if "/" in rest or "?" in rest or "#" in rest or "@" in rest:
            raise BadInput(f"HTTP origin {text!r} must be scheme://host[:port], with no path")
        if rest.startswith("["):
            host, bracket, after = rest[1:].partition("]")
            if not bracket:
                raise BadInput(f"HTTP origin {text!r}: unclosed [ in an IPv6 host")
            port_text = after[1:] if after.startswith(":") else None
            if after and port_text is None:
                raise BadInput(f"HTTP origin {text!r}: unexpected {after!r} after the host")
        else:
            host, colon, port_text_ = rest.partition(":")
            port_text = port_text_ if colon else None
        host = host.lower()
        if port_text is None:
            port: int | None = _DEFAULT_PORTS[scheme]
        elif port_text == "*":
            port = None
        elif port_text.isdigit() and 0 < int(port_text) < 65536:
            port = int(port_text)
        else:
            raise BadInput(f"HTTP origin {text!r}: the port must be 1-65535 or *")
        if not (_ip_literal(host) or _HOST.match(host)):
            raise BadInput(f"HTTP origin {text!r}: {host!r} is not a host name or IP address")
        return cls(scheme, host, port)  # type: ignore[arg-type]

    def matches(self, scheme: str, host: str, port: int) -> bool:
        """Whether a request to ``scheme://host:port`` (host lower-case, IPv6 bare) is in it."""
        if scheme != self.scheme or (self.port is not None and port != self.port):
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host

    @property
    def names_private(self) -> bool:
        """Whether the pattern itself names a private address (an IP literal or localhost)."""
        if self.host == "localhost":
            return True
        return _ip_literal(self.host) and is_private_address(self.host)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "*" if self.port is None else str(self.port)
        return f"{self.scheme}://{host}:{port}"


@dataclass(frozen=True, slots=True)
class Secret:
    """A header the host adds to every request of a grant, its value read from the host's
    environment (``env``) or a file (``file``) when the request is made, after ``prefix``
    (``"Bearer "``). The guest never sees the value: not in its environment, not in the
    request it built, not in response headers (an echo of the value is redacted), and not in a
    trace (which holds only what the guest saw, and the policy names only the source)."""

    header: str
    env: str | None = None
    file: str | None = None
    prefix: str = ""

    @classmethod
    def parse(cls, spec: str) -> Secret:
        """``HEADER=PREFIX${ENV_VAR}`` (``Authorization=Bearer ${OPENAI_API_KEY}``) or
        ``HEADER=PREFIX@/path/to/file``: the value is never in the spec, only where it is."""
        header, sep, value = spec.partition("=")
        if not sep:
            raise BadInput(f"secret {spec!r}: expected HEADER=VALUE")
        env = re.fullmatch(r"(.*)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value, re.DOTALL)
        if env is not None:
            return cls(header.strip(), env=env.group(2), prefix=env.group(1))
        prefix, at, path = value.rpartition("@")
        if at and path:
            return cls(header.strip(), file=path, prefix=prefix)
        raise BadInput(
            f"secret {spec!r}: the value must name its source, ${{ENV_VAR}} or @FILE "
            "(a literal secret on a command line would be in the shell's history)"
        )

    def __post_init__(self) -> None:
        if not _TOKEN.match(self.header or ""):
            raise BadInput(f"secret header name {self.header!r} is not a valid header name")
        for source in (self.env, self.file, self.prefix):
            if source is not None and not isinstance(source, str):
                raise BadInput(f"secret for {self.header!r}: env, file and prefix are strings")
        if (self.env is None) == (self.file is None):
            raise BadInput(f"secret for {self.header!r}: give exactly one of env= or file=")
        if any(c in self.prefix for c in "\r\n\x00"):
            raise BadInput(f"secret for {self.header!r}: the prefix holds a control character")


@dataclass(frozen=True, slots=True)
class HttpGrant:
    """One origin pattern the guest may reach, with what goes with it."""

    origin: Origin
    methods: tuple[str, ...] | None = None
    """Upper-case methods allowed; None: any."""
    secrets: tuple[Secret, ...] = ()
    allow_private: bool = False
    """Whether a DNS name of this origin may resolve to a private or loopback address."""

    def __post_init__(self) -> None:
        if self.methods is not None:
            for method in self.methods:
                if not _TOKEN.match(method) or method != method.upper():
                    raise BadInput(f"HTTP method {method!r} must be an upper-case token")

    @property
    def private_ok(self) -> bool:
        return self.allow_private or self.origin.names_private


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Bounds on one instance's HTTP use. Every one has a safe default."""

    max_in_flight: int = 16
    """Requests whose response the host is still receiving (a body the guest does not read
    keeps its request in flight while the read-ahead buffer is full)."""
    max_requests_per_call: int = 256
    """Requests one export call may make; more are refused with ``connection-limit-reached``."""
    max_request_bytes: int = 16 << 20
    """Bytes of one request body."""
    max_response_bytes: int = 64 << 20
    """Bytes of one response body; past it the body stream fails ``HTTP-response-body-size``."""
    max_header_bytes: int = 64 << 10
    """Bytes of one request's or response's header section."""
    max_held_header_bytes: int = 4 << 20
    """Bytes of header fields the guest may hold in live ``fields`` resources at once."""
    connect_timeout: float = 10.0
    first_byte_timeout: float = 60.0
    between_bytes_timeout: float = 60.0
    total_timeout: float = 300.0
    """Seconds one request may take from ``handle`` to its body's last byte."""
    buffer_bytes: int = 1 << 20
    """Bytes of a response read ahead of the guest (the connection waits while it is full)."""

    def __post_init__(self) -> None:
        for name in (
            "max_in_flight",
            "max_requests_per_call",
            "max_request_bytes",
            "max_response_bytes",
            "max_header_bytes",
            "max_held_header_bytes",
            "buffer_bytes",
        ):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise BadInput(f"HTTP limit {name} must be a positive int, got {value!r}")
        for name in ("connect_timeout", "first_byte_timeout", "between_bytes_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value <= 86_400:
                raise BadInput(f"HTTP limit {name} must be in (0, 86400] seconds, got {value!r}")
        if not isinstance(self.total_timeout, int | float) or not 0 < self.total_timeout <= 86_400:
            raise BadInput(f"HTTP total_timeout must be in (0, 86400]: {self.total_timeout!r}")


DEFAULT_HTTP_LIMITS = HttpLimits()


@dataclass(frozen=True, slots=True)
class HttpPolicy:
    """The guest's HTTP grants and limits. The default grants nothing."""

    grants: tuple[HttpGrant, ...] = ()
    limits: HttpLimits = field(default_factory=HttpLimits)

    @classmethod
    def from_description(cls, data: object) -> HttpPolicy:
        """The policy a trace recorded (``describe_policy``'s ``http``), checked as a new one
        is: a hostile trace gets a :class:`BadInput`, never a grant it could not have made."""
        if data is None:
            return cls()
        try:
            grants = []
            for g in data["grants"]:  # type: ignore[index]
                o = g["origin"]
                origin = Origin.parse(str(Origin(o["scheme"], str(o["host"]), o["port"])))
                methods = g.get("methods")
                grants.append(
                    HttpGrant(
                        origin,
                        None if methods is None else tuple(str(m) for m in methods),
                        tuple(
                            Secret(
                                str(x["header"]), x.get("env"), x.get("file"), x.get("prefix", "")
                            )
                            for x in g.get("secrets", ())
                        ),
                        bool(g.get("allow_private", False)),
                    )
                )
            limits = HttpLimits(**dict(data.get("limits") or {}))  # type: ignore[attr-defined]
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise BadInput(f"not an HTTP policy description: {exc}") from None
        return cls(tuple(grants), limits)

    def grant_for(self, scheme: str, host: str, port: int) -> HttpGrant | None:
        """The first grant whose origin matches, or None."""
        for grant in self.grants:
            if grant.origin.matches(scheme, host, port):
                return grant
        return None
