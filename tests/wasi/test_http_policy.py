"""wasi:http's policy data: origins, private addresses, secrets and limits (no network)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty._errors import BadInput
from mighty.wasi import HttpLimits, Origin, Policy, Secret
from mighty.wasi._http_policy import is_private_address

_LABEL = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?\Z")
_HOSTS = st.lists(_LABEL, min_size=1, max_size=4).map(".".join)
_PORTS = st.one_of(st.none(), st.integers(1, 65535))


@given(scheme=st.sampled_from(["http", "https"]), host=_HOSTS, port=_PORTS, wild=st.booleans())
def test_an_origin_prints_as_it_parses(
    scheme: str, host: str, port: int | None, wild: bool
) -> None:
    """str(Origin.parse(x)) parses back to the same origin, wildcard and any-port included."""
    pattern = ("*." if wild else "") + host
    text = f"{scheme}://{pattern}:{'*' if port is None else port}"
    origin = Origin.parse(text)
    assert Origin.parse(str(origin)) == origin
    assert (origin.host, origin.port) == (pattern, port)


@given(host=_HOSTS, sub=_LABEL, port=st.integers(1, 65535))
def test_a_wildcard_matches_subdomains_only(host: str, sub: str, port: int) -> None:
    """*.host matches sub.host on any port with '*', never host itself nor another scheme."""
    origin = Origin.parse(f"https://*.{host}:*")
    assert origin.matches("https", f"{sub}.{host}", port)
    assert not origin.matches("https", host, port)
    assert not origin.matches("http", f"{sub}.{host}", port)
    assert not origin.matches("https", f"{sub}{host}", port)


def test_a_default_port_is_the_schemes() -> None:
    """No port means 443 for https and 80 for http; another port does not match."""
    assert Origin.parse("https://api.example.com").port == 443
    assert Origin.parse("http://api.example.com").port == 80
    assert not Origin.parse("https://api.example.com").matches("https", "api.example.com", 8443)
    assert Origin.parse("http://[::1]:8080") == Origin("http", "::1", 8080)


@pytest.mark.parametrize(
    "text",
    [
        "ftp://x.com",
        "x.com",
        "https://x.com/path",
        "https://user@x.com",
        "https://x.com:0",
        "https://x.com:70000",
        "https://x .com",
        "https://[::1",
        "https://*",
        "https://a.*.com",
        "",
        "https://" + "a" * 400,
    ],
)
def test_a_malformed_origin_is_refused(text: str) -> None:
    """Anything but scheme://host[:port|:*] is a BadInput naming the origin."""
    with pytest.raises(BadInput):
        Origin.parse(text)


@pytest.mark.parametrize(
    ("address", "private"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("192.168.0.1", True),
        ("172.16.0.1", True),
        ("169.254.169.254", True),
        ("100.64.0.1", True),
        ("0.0.0.0", True),
        ("224.0.0.1", True),
        ("::1", True),
        ("fd00::1", True),
        ("fe80::1", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:169.254.169.254", True),
        ("8.8.8.8", False),
        ("2606:4700:4700::1111", False),
        ("::ffff:8.8.8.8", False),
    ],
)
def test_private_addresses(address: str, private: bool) -> None:
    """Loopback, RFC 1918, link-local (metadata), shared, multicast, unspecified and their
    IPv4-mapped forms are private; public unicast is not."""
    assert is_private_address(address) is private


@given(st.ip_addresses())
def test_a_public_address_is_global_unicast(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    """Whatever the address, 'not private' implies a global, non-multicast address."""
    if not is_private_address(str(address)):
        mapped = getattr(address, "ipv4_mapped", None) or address
        assert mapped.is_global and not mapped.is_multicast


def test_an_origin_that_is_a_private_address_grants_it() -> None:
    """127.0.0.1 and localhost name their address; a DNS name needs allow_private."""
    policy = Policy().with_http("http://127.0.0.1:8080").with_http("https://api.example.com")
    loopback, named = policy.http.grants
    assert loopback.private_ok and not named.private_ok
    allowed = Policy().with_http("https://db.internal", allow_private=True).http.grants[0]
    assert allowed.private_ok


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "Authorization=Bearer ${OPENAI_API_KEY}",
            Secret("Authorization", env="OPENAI_API_KEY", prefix="Bearer "),
        ),
        ("X-Key=${K}", Secret("X-Key", env="K")),
        ("X-Key=@/run/secrets/key", Secret("X-Key", file="/run/secrets/key")),
        ("Authorization=Token @key.txt", Secret("Authorization", file="key.txt", prefix="Token ")),
    ],
)
def test_a_secret_spec_names_its_source(spec: str, expected: Secret) -> None:
    """HEADER=PREFIX${VAR} and HEADER=PREFIX@FILE parse to where the value is."""
    assert Secret.parse(spec) == expected


@pytest.mark.parametrize(
    "spec", ["Authorization", "Authorization=sk-literal-secret", "bad header=${X}", "X=\r\n${K}"]
)
def test_a_literal_or_malformed_secret_is_refused(spec: str) -> None:
    """A spec without a source (a literal secret) or with a bad header name is refused."""
    with pytest.raises(BadInput):
        Secret.parse(spec)


@pytest.mark.parametrize(
    "change",
    [
        {"max_in_flight": 0},
        {"max_response_bytes": -1},
        {"connect_timeout": 0},
        {"total_timeout": 1e9},
        {"buffer_bytes": 1.5},
    ],
)
def test_a_limit_out_of_range_is_refused(change: dict[str, float]) -> None:
    """Every limit is checked when the policy is made."""
    with pytest.raises(BadInput):
        Policy().with_http_limits(**change)


def test_the_default_policy_grants_no_origin() -> None:
    """Policy() has no HTTP grant, and its limits are the documented defaults."""
    assert Policy().http.grants == ()
    assert Policy().http.limits == HttpLimits()
    assert Policy().http.grant_for("https", "example.com", 443) is None
