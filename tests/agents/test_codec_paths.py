"""An agent's export called through the compiled codec and through the Python one agree.

``Instance.call`` takes the compiled path (``FuncCodec.native``: lower, call and lift in C)
whenever the compiled codec takes the arguments, and the Python path otherwise. With
``MIGHTY_PURE_PYTHON=1`` set when the instance is made, it only ever takes the Python path. The
two must give the same results, the same errors (an ArgumentError leaves the instance usable),
the same fuel, and the same end for a guest that traps (the instance refuses further calls).
The compiled path also sets the call's fuel and reads what is left itself (the budget layer's
``fueled`` runs): a fuel limit ends a call the same way on both paths.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty import Component, Instance
from mighty._errors import ArgumentError, GuestTrap, OutOfFuel
from mighty.abi import Ok
from mighty.abi._native import native as compiled
from mighty.agents import Runtime
from mighty.budget import Budget

pytestmark = pytest.mark.skipif(compiled is None, reason="the compiled codec is not built")


@pytest.fixture(scope="module")
def runtime() -> Iterator[Runtime]:
    with Runtime(workers=1) as rt:
        yield rt


def _instance(component: Component, runtime: Runtime, pure: bool) -> Instance:
    saved = os.environ.pop("MIGHTY_PURE_PYTHON", None)
    if pure:
        os.environ["MIGHTY_PURE_PYTHON"] = "1"
    try:
        instance = Instance(component, gate=runtime.gate)
        instance.call("state-schema")  # the exports' codecs are made on first use
        instance.signature("handle")
        return instance
    finally:
        os.environ.pop("MIGHTY_PURE_PYTHON", None)
        if saved is not None:
            os.environ["MIGHTY_PURE_PYTHON"] = saved


def _outcome(instance: Instance, sender: Any, message: Any) -> tuple[str, Any]:
    try:
        value = instance.call("handle", sender, message)
    except ArgumentError as e:
        return ("argument", (str(e), e.path))
    assert instance.last_usage is not None
    return ("value", (value, instance.last_usage.fuel))


_ANY = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.lists(st.integers(-1, 300), max_size=3),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sender=st.one_of(st.text(max_size=8), _ANY),
    message=st.one_of(
        st.fixed_dictionaries({"name": st.text(max_size=8), "body": st.binary(max_size=64)}),
        st.fixed_dictionaries({"name": _ANY, "body": _ANY}),
        st.dictionaries(st.sampled_from(["name", "body", "extra"]), _ANY, max_size=3),
        _ANY,
    ),
)
def test_either_codec_gives_the_same_outcome(
    echo_agent: Component, runtime: Runtime, sender: Any, message: Any
) -> None:
    fast = _instance(echo_agent, runtime, pure=False)
    slow = _instance(echo_agent, runtime, pure=True)
    # The two instances really take different paths (Instance keeps each export's codec).
    assert fast._export("handle").codec.native is not None
    assert slow._export("handle").codec.native is None
    got, want = _outcome(fast, sender, message), _outcome(slow, sender, message)
    assert got == want
    if got[0] == "value":
        assert got[1][0] == Ok({"name": "reply", "body": bytes(message["body"])})
    # Usable afterwards either way (an ArgumentError is raised before the guest is entered).
    ok = {"name": "n", "body": b"b"}
    assert fast.call("handle", "s", ok) == slow.call("handle", "s", ok)


def test_a_trap_ends_the_instance_the_same_way(crasher_wasm: Path, runtime: Runtime) -> None:
    component = Component.load(crasher_wasm)
    seen = []
    for pure in (False, True):
        instance = _instance(component, runtime, pure)
        with pytest.raises(GuestTrap) as trapped:
            instance.call("handle", "s", {"name": "crash", "body": b""})
        with pytest.raises(GuestTrap, match="unusable after an earlier failure"):
            instance.call("handle", "s", {"name": "fine", "body": b""})
        seen.append((trapped.value.trap_code, instance.poisoned))
    assert seen[0] == seen[1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuel=st.one_of(st.integers(1, 400), st.integers(1, 2**40)), calls=st.integers(1, 3))
def test_either_path_counts_and_limits_fuel_the_same_way(
    echo_agent: Component, runtime: Runtime, fuel: int, calls: int
) -> None:
    """The echo handler takes about 160 fuel: limits below, around and far above it, each
    set again for every call (a call's leftover fuel never carries over)."""
    used = _instance(echo_agent, runtime, pure=True)
    used.call("handle", "s", {"name": "n", "body": b"b"})
    assert used.last_usage is not None
    need = used.last_usage.fuel
    seen = []
    for pure in (False, True):
        instance = _instance(echo_agent, runtime, pure)
        outcomes: list[tuple[Any, ...]] = []
        for _ in range(calls):
            try:
                value = instance.call(
                    "handle", "s", {"name": "n", "body": b"b"}, budget=Budget(fuel=fuel)
                )
            except OutOfFuel as e:
                spent = None if e.usage is None else e.usage.fuel
                outcomes.append(("out of fuel", e.fuel_limit, spent, instance.poisoned))
                break
            assert instance.last_usage is not None
            outcomes.append(("value", value, instance.last_usage.fuel))
        seen.append(outcomes)
    assert seen[0] == seen[1]
    if fuel >= need:
        assert seen[0] == [("value", Ok({"name": "reply", "body": b"b"}), need)] * calls
    elif seen[0][0][0] == "value":
        # wasmtime checks fuel where a block begins: the last block may overrun a limit a
        # little short of what the call needs; the fuel left is then 0, so all of it counts.
        assert fuel >= need - _LAST_BLOCK
        assert seen[0] == [("value", Ok({"name": "reply", "body": b"b"}), fuel)] * calls
    else:
        assert len(seen[0]) == 1
        kind, limit, spent, poisoned = seen[0][0]
        assert (kind, limit, spent) == ("out of fuel", fuel, fuel) and poisoned is not None


_LAST_BLOCK = 8
"""Fuel the echo handler's last block may take past its limit (1 measured)."""
