"""Values round-trip exactly through real wasmtime calls: export path and host-import path.

Each call to ``g`` lowers with ``lower_params``, wasmtime lowers into guest memory and lifts
into our host import ``f`` (``lift_args``), ``f`` returns the value (``lower_result``), and the
guest returns it to us (``lift_result``).
"""

from __future__ import annotations

import resource
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wasmtime.component import ResourceAny, ResourceHost

from mighty._errors import ArgumentError
from mighty.abi import (
    F32,
    F64,
    S64,
    STRING,
    U8,
    U32,
    U64,
    Err,
    ListType,
    MapType,
    Ok,
    OptionType,
    OwnType,
    RecordType,
    ResultType,
    Some,
    TupleType,
    WitType,
)

from ._harness import BYTES_EXPORT_WAT, MAP_ENGINE, RESOURCE_TYPE, Echo
from ._strategies import PRIMITIVES, same, typed_values, values, wit_types

_ECHOES: dict[WitType, Echo] = {}


def echo(wt: WitType) -> Echo:
    if wt not in _ECHOES:
        _ECHOES[wt] = Echo(wt)
    return _ECHOES[wt]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_values(depth=2, maps=False))
def test_random_types_and_values_round_trip_through_wasmtime(tv: tuple[WitType, Any]) -> None:
    """Random types and values come back unchanged through export and import paths."""
    wt, v = tv
    assert same(echo(wt).call(v), v)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 65536, 1 << 20])
def test_list_u8_sizes_round_trip(size: int) -> None:
    """list<u8> of 0 B, 1 B, 64 KiB and 1 MiB round-trips byte for byte."""
    data = bytes((i * 7 + 3) % 256 for i in range(size))
    assert echo(ListType(U8)).call(data) == data


# Flat fields (primitives and primitive lists) and a few others (enums, flags): a record of
# only the first kind takes the template path, one mixing both the field-by-field one.
_FLAT_FIELD = st.one_of(wit_types(0), st.sampled_from(PRIMITIVES).map(ListType)).flatmap(
    lambda t: st.tuples(st.just(t), values(t))
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_FLAT_FIELD, min_size=1, max_size=4))
def test_flat_records_round_trip_through_wasmtime(fields: list[tuple[WitType, Any]]) -> None:
    """Records of flat fields (lowered from a cloned template) come back unchanged, and a
    message-shaped record with bodies on both sides of the short-list cut-over too."""
    wt = RecordType(tuple((f"f{i}", t) for i, (t, _) in enumerate(fields)))
    v = {f"f{i}": value for i, (_, value) in enumerate(fields)}
    assert same(echo(wt).call(v), v)
    message = RecordType((("name", STRING), ("body", ListType(U8))))
    for size in (0, 3, 4096, 4097):
        value = {"name": "ping", "body": bytes(range(256)) * (size // 256) + bytes(size % 256)}
        assert echo(message).call(value) == value


def test_guest_export_returns_bytes_without_host_import() -> None:
    """A plain guest export returning its list<u8> argument gives back the same bytes."""
    e = Echo(ListType(U8), wat=BYTES_EXPORT_WAT)
    data = bytes(range(256)) * 300
    assert e.call(data) == data
    assert e.call(b"") == b""


@pytest.mark.parametrize(
    ("wt", "values"),
    [
        (ResultType(U32, U32), [Ok(1), Err(1), Ok(0), Err(2**32 - 1)]),
        (OptionType(OptionType(U8)), [None, Some(None), Some(5)]),
        (ResultType(None, None), [Ok(), Err()]),
        (ListType(U32), [[0, 1, 2**32 - 1] * 1000]),
        (ListType(S64), [[-(2**63), 2**63 - 1, 0]]),
        (ListType(U64), [[2**64 - 1, 0]]),
        (ListType(F32), [[1.5, -0.0, float("inf")]]),
        (ListType(F64), [[1e308, -1e-308, 0.1]]),
        (ListType(ListType(U8)), [[b"", b"abc", bytes(1000)]]),
        (TupleType((STRING, ListType(U8))), [("héllo wörld ✓", b"\x00\xff")]),
    ],
)
def test_fixed_values_round_trip(wt: WitType, values: list[Any]) -> None:
    """Results keep Ok/Err apart even with equal payload types; nested options keep Some."""
    for v in values:
        assert same(echo(wt).call(v), v)


def test_large_result_list_of_records_round_trips() -> None:
    """A list of 10^5 records crosses both ways without trouble."""
    wt = ListType(RecordType((("a", U32), ("b", OptionType(STRING)))))
    value = [{"a": i, "b": None if i % 3 else str(i)} for i in range(100_000)]
    assert echo(wt).call(value) == value


def test_a_million_element_list_round_trips() -> None:
    """A list<u32> of 10^6 elements round-trips."""
    value = list(range(1_000_000))
    assert echo(ListType(U32)).call(value) == value


def test_map_round_trips_with_the_map_proposal_enabled() -> None:
    """map<string, u32> round-trips as a dict when the engine enables component-model maps."""
    wt = MapType(STRING, ListType(U32))
    e = Echo(wt, engine=MAP_ENGINE)
    assert e.codec.sig.result == wt
    for v in ({}, {"a": [1, 2], "b": []}):
        assert e.call(v) == v


def test_own_resource_round_trips_through_guest_and_host() -> None:
    """An own<r> handle from the host goes through the guest and the host import and back."""
    seen: list[int] = []

    def host(r: ResourceAny) -> ResourceAny:
        assert r.owned
        seen.append(1)
        return r

    e = Echo(OwnType(RESOURCE_TYPE), host=host)
    out = e.call(ResourceHost.own(42, 7))
    assert isinstance(out, ResourceAny)
    assert out.to_host(e.store).rep == 42
    assert seen == [1]


def test_host_import_returning_a_bad_value_fails_the_call_with_a_path() -> None:
    """A host import returning a value that does not fit raises ArgumentError at result."""
    wt = RecordType((("n", U8),))
    e = Echo(wt, host=lambda _x: {"n": 256})
    with pytest.raises(ArgumentError) as info:
        e.call({"n": 1})
    assert info.value.path == "result.n"
    # the instance is still usable afterwards
    e2 = Echo(wt)
    assert e2.call({"n": 2}) == {"n": 2}


def test_import_arguments_are_not_leaked_or_double_freed() -> None:
    """Many calls moving 1 MiB strings through the host import keep memory flat."""
    e = echo(STRING)
    big = "x" * (1 << 20)
    for _ in range(20):
        assert e.call(big) == big
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(200):
        e.call(big)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 100 * 1024  # 200 leaked MiB-strings x several copies would be far more
