"""The state-taking forms the gate's fused frames call (``Binding.direct``) answer what the
bindings' own functions answer, call for call, under every clock and random policy."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.gate import Binding, GuestContext
from mighty.wasi import _clocks, _random
from mighty.wasi._policy import Policy
from tests.wasi import make_ctx

M = "wasi:clocks/monotonic-clock"
W = "wasi:clocks/wall-clock"
R = "wasi:random/random"
INS = "wasi:random/insecure"


def _binding(interface: str, name: str) -> Binding:
    for binding in _clocks.bindings() + _random.bindings():
        if binding.interface == interface and binding.name == name:
            return binding
    raise KeyError(name)


def _as_fn(binding: Binding, ctx: GuestContext, *args: Any) -> Any:
    return binding.fn(ctx, *args)


def _as_direct(binding: Binding, ctx: GuestContext, *args: Any) -> Any:
    assert binding.direct is not None
    value = binding.direct.call(ctx.slot(binding.direct.slot), *args)
    if isinstance(value, tuple):  # a record's fields in order
        return {"seconds": value[0], "nanoseconds": value[1]}
    return value


CLOCK_OPS = st.lists(
    st.one_of(
        st.just(("now", M)),
        st.just(("now", W)),
        st.tuples(st.just("fuel"), st.integers(0, 10**9)),
    ),
    max_size=20,
)


@given(
    mode=st.sampled_from(["fixed", "virtual"]),
    start=st.integers(-(2**63), 2**64 - 1),
    ops=CLOCK_OPS,
)
def test_clock_direct_is_the_binding(mode: str, start: int, ops: list[tuple[str, Any]]) -> None:
    """Deterministic clocks: the same readings through either form, fuel moving between them."""
    policy = Policy().with_clock(mode, start)  # type: ignore[arg-type]
    through_fn, through_direct = make_ctx(policy), make_ctx(policy)
    for op, what in ops:
        if op == "fuel":
            through_fn.store.set_fuel(what)
            through_direct.store.set_fuel(what)
            continue
        binding = _binding(what, "now")
        assert _as_direct(binding, through_direct) == _as_fn(binding, through_fn)


def test_real_clock_direct_reads_the_host() -> None:
    """Real clocks: readings through both forms interleaved never go back, and the wall
    clock's datetime is the host's time."""
    ctx = make_ctx(Policy())
    mono = _binding(M, "now")
    readings = []
    for _ in range(50):
        readings += [_as_fn(mono, ctx), _as_direct(mono, ctx)]
    assert readings == sorted(readings)
    wall = _binding(W, "now")
    before = time.time_ns()
    seen = _as_direct(wall, ctx)
    after = time.time_ns()
    assert 0 <= seen["nanoseconds"] < 10**9
    assert before <= seen["seconds"] * 10**9 + seen["nanoseconds"] <= after


RANDOM_OPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([R, INS]), st.just("bytes"), st.integers(0, 600)),
        st.tuples(st.sampled_from([R, INS]), st.just("bytes"), st.integers(0, 9)),
        st.tuples(st.sampled_from([R, INS]), st.just("u64"), st.just(0)),
    ),
    max_size=30,
)
_NAMES = {
    (R, "bytes"): "get-random-bytes",
    (R, "u64"): "get-random-u64",
    (INS, "bytes"): "get-insecure-random-bytes",
    (INS, "u64"): "get-insecure-random-u64",
}


def _random_answers(ctx: GuestContext, ops: list[tuple[str, str, int]], direct: bool) -> list[Any]:
    out: list[Any] = []
    for interface, op, length in ops:
        binding = _binding(interface, _NAMES[interface, op])
        args = (length,) if op == "bytes" else ()
        call = _as_direct if direct else _as_fn
        try:
            out.append(call(binding, ctx, *args))
        except _random.RandomTooLong as exc:
            out.append(("too long", str(exc)))
    return out


@given(seed=st.integers(-(2**70), 2**70), max_read=st.integers(1, 700), ops=RANDOM_OPS)
def test_seeded_random_direct_is_the_binding(seed: int, max_read: int, ops: Any) -> None:
    """A seeded stream is the same stream through either form (the same refusals too)."""
    policy = Policy(seed=seed, max_read=max_read)
    assert _random_answers(make_ctx(policy), ops, True) == _random_answers(
        make_ctx(policy), ops, False
    )


@given(max_read=st.integers(1, 700), pool=st.sampled_from([256, 300, 4096]), ops=RANDOM_OPS)
def test_pooled_random_direct_is_the_binding(max_read: int, pool: int, ops: Any) -> None:
    """Unseeded: given the same OS bytes, both forms hand out the same bytes from the pool
    (each byte once, refills and direct draws alike). The OS is replaced by a counter here
    only so that two instances can be compared, and the pool made small so that it runs out."""

    def counted() -> Any:
        state = {"n": 0}

        def urandom(n: int) -> bytes:
            state["n"] += 1
            return bytes((state["n"] + i) % 256 for i in range(n))

        return urandom

    policy = Policy(max_read=max_read)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_random, "POOL_SIZE", pool)
        patch.setattr(_random, "_urandom", counted())
        by_direct = _random_answers(make_ctx(policy), ops, True)
        patch.setattr(_random, "_urandom", counted())
        by_fn = _random_answers(make_ctx(policy), ops, False)
    assert by_direct == by_fn
