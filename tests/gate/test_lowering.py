"""The gate's fast paths (arguments read at their address, results written as bytes) do
what the codec does, and refuse what it refuses."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
import wasmtime
from hypothesis import given, settings
from hypothesis import strategies as st
from wasmtime import _ffi as ffi

from mighty._errors import ArgumentError
from mighty.abi import (
    BOOL,
    S8,
    S16,
    U8,
    U32,
    U64,
    Err,
    FuncCodec,
    FuncSig,
    ListType,
    Ok,
    RecordType,
    ResultType,
)
from mighty.engine import get_engine
from mighty.gate import Direct, Gate, GuestViolation, MissingSlot, Slot
from mighty.gate._frames import _fused, _getter, _lowerer
from mighty.gate._native import _CallStore

_VAL = ffi.wasmtime_component_val_t

SIGS = [
    FuncSig((), ResultType(None, U32)),  # result<_, u32>: Ok of nothing as bytes
    FuncSig((), ResultType(U64, U8)),  # result<u64, u8>: Ok of an int, boxed
    FuncSig((), ResultType(S16, None)),
    FuncSig((), U32),  # a bare int: the whole slot at once
    FuncSig((), S16),
    # wasi:clocks datetime: a cloned template with its integers written in place
    FuncSig((), RecordType((("seconds", U64), ("nanoseconds", U32)))),
    FuncSig((), RecordType((("a", S8),))),
    FuncSig((), ListType(U8)),  # bytes: the element slots in one buffer
]

ints = st.integers(-(2**70), 2**70) | st.integers(-300, 300)

values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
    st.builds(Ok, st.none() | st.integers(-(2**70), 2**70) | st.booleans()),
    st.builds(Err, st.none() | st.integers(-(2**10), 2**10)),
    st.dictionaries(
        st.sampled_from(["seconds", "nanoseconds", "a", "b"]), ints | st.booleans() | st.none()
    ),
    st.binary(max_size=5000),  # both sides of the small-list cut-off
    st.binary(max_size=20).map(bytearray),
    st.lists(st.integers(-2, 300), max_size=4),
)


def _through(lower: Any, codec: FuncCodec, value: Any) -> Any:
    """Lower ``value`` into a fresh slot, then lift it back (freeing what it holds)."""
    slot = _VAL()
    try:
        lower(None, None, value, ctypes.addressof(slot))
    except ArgumentError as exc:
        return ("refused", str(exc))
    return codec.lift_result(slot)


@given(st.sampled_from(SIGS), values)
def test_fast_lowering_is_the_codecs(sig: FuncSig, value: Any) -> None:
    """Every value, right or wrong for the type: the gate's lowerer gives back what the
    codec's own lowering gives back, or the same refusal."""
    codec = FuncCodec(sig)

    def generic(_ctx: Any, store: Any, result: Any, address: int) -> None:
        codec.lower_result_into(store, result, _VAL.from_address(address))

    assert _through(_lowerer(codec, None), codec, value) == _through(generic, codec, value)


@pytest.mark.parametrize("sig", SIGS, ids=str)
@given(
    seen=st.lists(values | st.builds(Ok, st.integers(0, 300)) | st.integers(-300, 300), max_size=8)
)
def test_a_lowerer_used_again_is_the_codecs(sig: FuncSig, seen: list[Any]) -> None:
    """One lowerer serving many results, each value twice (what it keeps from one result for
    the next, e.g. an Ok(int) payload ready to box, changes nothing): the codec's answers."""
    codec = FuncCodec(sig)
    lower = _lowerer(codec, None)

    def generic(_ctx: Any, store: Any, result: Any, address: int) -> None:
        codec.lower_result_into(store, result, _VAL.from_address(address))

    for value in seen + seen:
        assert _through(lower, codec, value) == _through(generic, codec, value)


@pytest.mark.parametrize(
    ("sig", "value"),
    [
        (SIGS[0], Ok(None)),
        (SIGS[1], Ok(2**64 - 1)),
        (SIGS[3], 2**32 - 1),
        (SIGS[4], -(2**15)),
        (SIGS[5], {"seconds": 2**64 - 1, "nanoseconds": 999_999_999}),
        (SIGS[6], {"a": -128}),
        (SIGS[7], b""),
        (SIGS[7], bytes(range(256)) * 16),
    ],
)
def test_fast_lowering_round_trips(sig: FuncSig, value: Any) -> None:
    """The values the fast paths take come back as they went in."""
    codec = FuncCodec(sig)
    assert _through(_lowerer(codec, None), codec, value) == value


def _arg_values(t: Any) -> st.SearchStrategy[Any]:
    if t == BOOL:
        return st.booleans()
    if isinstance(t, ListType):
        return st.binary(max_size=5000)  # both sides of the small-list cut-off
    lo, hi = {"u8": (0, 255), "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1)}.get(
        t.name, (-(2**15), 2**15 - 1)
    )
    return st.integers(lo, hi)


@given(st.sampled_from([U8, U32, U64, S16, BOOL, ListType(U8)]).flatmap(
    lambda t: st.tuples(st.just(t), _arg_values(t))
), st.booleans())  # fmt: skip
def test_arguments_read_at_their_address_are_the_codecs(
    case: tuple[Any, Any], native: bool
) -> None:
    """An argument the gate reads straight from its value's address is what the codec lifts,
    with the compiled codec (when built) and without it."""
    t, value = case
    codec = FuncCodec(FuncSig((("x", t),), None), native=native)
    params = codec.lower_params(None, [value])
    try:
        lift = codec.lifters()[0]
        read = _getter(t, codec.address_lifters()[0], codec.compiled_params[0])
        assert read(ctypes.addressof(params.array[0])) == lift(params.array[0]) == value
    finally:
        codec.free_params(params.array, 1)


# -- fused frames: argument read, host function and result write in one frame (``_fused``) --

FUSED = [
    FuncSig((), U64),  # monotonic-clock now
    FuncSig((), S16),
    FuncSig((), RecordType((("seconds", U64), ("nanoseconds", U32)))),  # wall-clock now
    FuncSig((), RecordType((("a", S8), ("b", U8)))),
    FuncSig((("len", U64),), ListType(U8)),  # get-random-bytes
    FuncSig((("n", U8),), ListType(U8)),
    FuncSig((("flag", BOOL),), ListType(U8)),
]


def _slot_kind(slot: Any) -> int:
    """The kind byte of a lowered value (what wasmtime reads first)."""
    return ctypes.string_at(ctypes.addressof(slot), 1)[0]


_STATE: Slot[str] = Slot("test.state")


def _serve_through(
    sig: FuncSig,
    served: Any,
    args: list[Any],
    store: Any,
    nargs: int | None = None,
    direct: bool = False,
) -> Any:
    """Serve one call with a fused frame whose host function returns ``served``: what the
    guest gets (lifted back), the refusal's message, or the arity violation's. ``direct``:
    through the binding's state-taking form (a record's fields as a tuple), on an instance
    whose slot holds the state it checks for."""
    codec = FuncCodec(sig)
    seen: list[Any] = []

    def fn(_ctx: Any, *got: Any) -> Any:
        seen.append(got)
        return served

    def call(state: str, *got: Any) -> Any:
        assert state == "the state"
        seen.append(got)
        if isinstance(sig.result, RecordType) and type(served) is dict:
            names = [name for name, _ in sig.result.fields]
            if sorted(served) == sorted(names):
                return tuple(served[name] for name in names)
        return served

    ctx = None
    if direct:
        ctx = Gate([]).context(wasmtime.Store(get_engine()), seed=[_STATE.of("the state")])
    serve = _fused(
        fn,
        _lowerer(codec, None),
        [t for _, t in sig.params],
        sig.result,
        Direct(_STATE, call) if direct else None,
    )
    assert serve is not None, sig
    params = codec.lower_params(None, args) if args else None
    slot = _VAL()
    try:
        args_ptr = ctypes.addressof(params.array) if params is not None else None
        try:
            serve(
                ctx,
                store,
                None,
                args_ptr,
                len(args) if nargs is None else nargs,
                ctypes.addressof(slot),
            )
        except ArgumentError as exc:
            return ("refused", str(exc), seen)
        except GuestViolation as exc:
            return ("violation", str(exc), seen)
        return (_slot_kind(slot), codec.lift_result(slot), seen)
    finally:
        if params is not None:
            codec.free_params(params.array, len(args))


def _generic_through(sig: FuncSig, served: Any, args: list[Any]) -> Any:
    """The oracle: the codec's own lowering of ``served`` (the host function sees ``args``)."""
    codec = FuncCodec(sig)
    slot = _VAL()
    try:
        codec.lower_result_into(None, served, slot)
    except ArgumentError as exc:
        return ("refused", str(exc), [tuple(args)])
    return (_slot_kind(slot), codec.lift_result(slot), [tuple(args)])


def _fused_args(sig: FuncSig) -> st.SearchStrategy[list[Any]]:
    return st.tuples(*(_arg_values(t) for _, t in sig.params)).map(list)


def _right(t: Any) -> st.SearchStrategy[Any]:
    """Values of WIT type ``t`` and ones just outside it (the fast writes' edges)."""
    if isinstance(t, RecordType):
        return st.fixed_dictionaries({name: _right(f) for name, f in t.fields})
    if isinstance(t, ListType):
        return st.binary(max_size=300) | st.binary(min_size=250, max_size=260)
    lo, hi = _edges(t.name)
    inside = st.integers(lo, hi) | st.sampled_from([lo, hi])
    return inside | inside | st.sampled_from([lo - 1, hi + 1, True, 1.0])


def _edges(name: str) -> tuple[int, int]:
    bits = int(name[1:])
    return (0, 2**bits - 1) if name[0] == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _fused_case(sig: FuncSig) -> st.SearchStrategy[tuple[FuncSig, list[Any], Any]]:
    assert sig.result is not None
    return st.tuples(st.just(sig), _fused_args(sig), st.one_of(_right(sig.result), values))


@settings(max_examples=400)
@given(st.sampled_from(FUSED).flatmap(_fused_case))
def test_a_fused_frame_is_the_codecs(case: tuple[FuncSig, list[Any], Any]) -> None:
    """Whatever the host function returns, right or wrong for the type: the fused frame hands
    it the arguments the codec lifts and gives the guest what the codec lowers, or the same
    refusal."""
    sig, args, served = case
    assert _serve_through(sig, served, args, _CallStore()) == _generic_through(sig, served, args)


@given(st.sampled_from(FUSED).flatmap(_fused_case))
def test_a_fused_frame_through_the_direct_form_is_the_codecs(
    case: tuple[FuncSig, list[Any], Any],
) -> None:
    """The same through a binding's state-taking form (``Direct``): the state found in the
    instance's slot, a record's fields taken as a tuple, the codec's answers and refusals."""
    sig, args, served = case
    assert _serve_through(sig, served, args, _CallStore(), direct=True) == _generic_through(
        sig, served, args
    )


@pytest.mark.parametrize("sig", FUSED, ids=str)
def test_a_missing_slot_is_missing_slot(sig: FuncSig) -> None:
    """A state-taking form whose slot the instance never filled: ``MissingSlot``, as
    ``ctx.slot`` raises it, before anything is written."""
    serve = _fused(
        lambda *_: pytest.fail("not called"),
        _lowerer(FuncCodec(sig), None),
        [t for _, t in sig.params],
        sig.result,
        Direct(_STATE, lambda *_: pytest.fail("not called")),
    )
    assert serve is not None
    ctx = Gate([]).context(wasmtime.Store(get_engine()))
    codec = FuncCodec(sig)
    args = [True] if sig.params and sig.params[0][1] == BOOL else [1] * len(sig.params)
    params = codec.lower_params(None, args) if args else None
    slot = _VAL()
    try:
        args_ptr = ctypes.addressof(params.array) if params is not None else None
        with pytest.raises(MissingSlot, match=r"test\.state"):
            serve(ctx, _CallStore(), None, args_ptr, len(args), ctypes.addressof(slot))
    finally:
        if params is not None:
            codec.free_params(params.array, len(args))
    assert _slot_kind(slot) == 0


@given(
    st.sampled_from([s for s in FUSED if s.params]),
    st.lists(st.binary(max_size=300), min_size=1, max_size=8),
)
def test_one_instances_list_slots_serve_every_result(sig: FuncSig, results: list[bytes]) -> None:
    """The instance's slots buffer, used again for results of every size (longer, then
    shorter): each result is exactly its own bytes, none of the one before."""
    store = _CallStore()
    for served in results + results[::-1]:
        arg = [True] if sig.params[0][1] == BOOL else [1]
        assert _serve_through(sig, served, arg, store) == (13, served, [tuple(arg)])


@pytest.mark.parametrize("sig", FUSED, ids=str)
def test_a_fused_frame_checks_the_arity(sig: FuncSig) -> None:
    """A call with the wrong number of arguments is refused before the host function runs."""
    args = [True] if sig.params and sig.params[0][1] == BOOL else [1] * len(sig.params)
    wrong = len(args) + 1
    assert _serve_through(sig, b"", args, _CallStore(), nargs=wrong) == (
        "violation",
        f"expected {len(args)} arguments, got {wrong}",
        [],
    )
