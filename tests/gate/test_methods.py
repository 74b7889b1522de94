"""The gate's one-frame paths: a ``[method]`` on a borrowed resource (every WASI stream call),
an import taking one integer, a record of integers and a ``list<u8>`` as results. Same
answers as the general path, and the same refusals of stale or forged handles."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty import Component, GuestTrap, Instance
from mighty.gate import Binding, Gate, GuestContext, HostFunctionFailed, ResourceKind, StaleHandle

WAT = """
(component
  (import "t:m/api" (instance $api
    (export "r" (type $r (sub resource)))
    (type $pair0 (record (field "lo" u32) (field "hi" s64)))
    (export "pair" (type $pair (eq $pair0)))
    (export "[constructor]r" (func (param "v" u32) (result (own $r))))
    (export "[method]r.get" (func (param "self" (borrow $r)) (result u32)))
    (export "[method]r.add" (func (param "self" (borrow $r)) (param "x" u32) (result u32)))
    (export "split" (func (param "v" s64) (result $pair)))
    (export "repeat" (func (param "n" u32) (result (list u8))))
  ))
  (alias export $api "r" (type $r))
  (core module $libc
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) (local $at i32)
      (local.set $at (global.get $next))
      (global.set $next (i32.add (local.get $at) (i32.add (local.get 3) (i32.const 8))))
      (local.get $at)))
  (core instance $libc (instantiate $libc))
  (alias core export $libc "memory" (core memory $mem))
  (alias core export $libc "realloc" (core func $realloc))
  (core func $make (canon lower (func $api "[constructor]r")))
  (core func $get (canon lower (func $api "[method]r.get")))
  (core func $add (canon lower (func $api "[method]r.add")))
  (core func $split (canon lower (func $api "split") (memory $mem)))
  (core func $repeat (canon lower (func $api "repeat") (memory $mem) (realloc $realloc)))
  (core func $drop (canon resource.drop $r))
  (core module $m
    (import "api" "make" (func $make (param i32) (result i32)))
    (import "api" "get" (func $get (param i32) (result i32)))
    (import "api" "add" (func $add (param i32 i32) (result i32)))
    (import "api" "split" (func $split (param i64 i32)))
    (import "api" "repeat" (func $repeat (param i32 i32)))
    (import "api" "drop" (func $drop (param i32)))
    (import "libc" "memory" (memory 1))
    (func (export "make") (param i32) (result i32) local.get 0 call $make)
    (func (export "get") (param i32) (result i32) local.get 0 call $get)
    (func (export "add") (param i32 i32) (result i32) local.get 0 local.get 1 call $add)
    (func (export "drop") (param i32) local.get 0 call $drop)
    ;; split(v): lo + hi of the record the host returns, as one s64 (hi * 2^32 + lo)
    (func (export "split") (param i64) (result i64)
      local.get 0 i32.const 16 call $split
      i32.const 24 i64.load i64.const 32 i64.shl
      i32.const 16 i32.load i64.extend_i32_u i64.add)
    ;; repeat(n): the sum of the bytes of the list the host returns, times 65536, plus its length
    (func (export "repeat") (param i32) (result i32) (local $p i32) (local $n i32) (local $s i32)
      local.get 0 i32.const 32 call $repeat
      i32.const 32 i32.load local.set $p
      i32.const 36 i32.load local.set $n
      (block $out (loop $l
        (br_if $out (i32.eqz (local.get $n)))
        (local.set $s (i32.add (local.get $s) (i32.load8_u (local.get $p))))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $l)))
      (i32.add (i32.shl (local.get $s) (i32.const 16)) (i32.load (i32.const 36)))))
  (core instance $i (instantiate $m
    (with "libc" (instance $libc))
    (with "api" (instance
      (export "make" (func $make)) (export "get" (func $get)) (export "add" (func $add))
      (export "split" (func $split)) (export "repeat" (func $repeat))
      (export "drop" (func $drop))))))
  (func (export "make") (param "v" u32) (result u32) (canon lift (core func $i "make")))
  (func (export "get") (param "h" u32) (result u32) (canon lift (core func $i "get")))
  (func (export "add") (param "h" u32) (param "x" u32) (result u32)
    (canon lift (core func $i "add")))
  (func (export "drop") (param "h" u32) (canon lift (core func $i "drop")))
  (func (export "split") (param "v" s64) (result s64) (canon lift (core func $i "split")))
  (func (export "repeat") (param "n" u32) (result u32) (canon lift (core func $i "repeat")))
)
"""

R = ResourceKind("t:m/api", "r")


class Api:
    def resources(self) -> Iterable[ResourceKind]:
        return [R]

    def bindings(self) -> Iterable[Binding]:
        api = "t:m/api"
        return [
            Binding(api, "[constructor]r", lambda ctx, v: ctx.new(R, [v])),
            Binding(api, "[method]r.get", lambda _ctx, obj: obj[0]),
            Binding(api, "[method]r.add", _add),
            Binding(api, "split", _split),
            Binding(api, "repeat", lambda _ctx, n: bytes(i % 256 for i in range(n))),
        ]

    def setup(self, ctx: GuestContext) -> None:
        pass


def _add(_ctx: GuestContext, obj: list[int], x: int) -> int:
    obj[0] = (obj[0] + x) % 2**32
    return obj[0]


def _split(_ctx: GuestContext, v: int) -> Any:
    if v == -1:
        return {"lo": 1}  # a missing field: the codec refuses it
    if v == -2:
        return {"lo": 2**32, "hi": 0}  # out of range
    return {"lo": v % 2**32, "hi": v >> 32}


@pytest.fixture(scope="module")
def component(wat: Callable[[str], bytes]) -> Component:
    return Component.load(wat(WAT))


@settings(max_examples=25)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6))
def test_methods_reach_their_objects(component: Component, adds: list[int]) -> None:
    """[method]s with and without an argument find the object behind their handle."""
    with Instance(component, gate=Gate([Api()])) as instance:
        a, b = instance.call("make", 1), instance.call("make", 1000)
        total = 1
        for x in adds:
            total = (total + x) % 2**32
            assert instance.call("add", a, x) == total
        assert instance.call("get", a) == total
        assert instance.call("get", b) == 1000


def test_a_forged_handle_traps_the_guest(component: Component) -> None:
    """A handle index the guest never got is refused by wasmtime before the host sees it."""
    with Instance(component, gate=Gate([Api()])) as instance:
        instance.call("make", 5)
        with pytest.raises(GuestTrap):
            instance.call("get", 77)


def test_a_dropped_handle_traps_the_guest(component: Component) -> None:
    """Using a handle after dropping it is refused (no stale object reached)."""
    with Instance(component, gate=Gate([Api()])) as instance:
        h = instance.call("make", 5)
        instance.call("drop", h)
        with pytest.raises(GuestTrap):
            instance.call("add", h, 1)


def test_a_handle_whose_object_is_gone_is_stale(component: Component) -> None:
    """A live guest handle whose host object left the table (a host bookkeeping bug) fails
    the call with StaleHandle, for a method with and without an argument."""
    for export, extra in (("get", ()), ("add", (1,))):
        with Instance(component, gate=Gate([Api()])) as instance:
            h = instance.call("make", 5)
            (rep,) = [rep for name, rep in instance.context.holdings() if name == "t:m/api/r"]
            instance.context._drop(R.type_id, rep)
            with pytest.raises(HostFunctionFailed) as info:
                instance.call(export, h, *extra)
            assert isinstance(info.value.__cause__, StaleHandle)


@settings(max_examples=40)
@given(st.integers(-(2**63), 2**63 - 1))
def test_a_record_of_integers_reaches_the_guest(component: Component, v: int) -> None:
    """The record the host returns arrives field by field (its template cloned per result)."""
    if v in (-1, -2):
        v = 0
    with Instance(component, gate=Gate([Api()])) as instance:
        assert instance.call("split", v) == (v >> 32) * 2**32 + v % 2**32


@pytest.mark.parametrize("v", [-1, -2])
def test_a_wrong_record_fails_the_call(component: Component, v: int) -> None:
    """A record the host gets wrong is refused by the codec, as the general path would."""
    with Instance(component, gate=Gate([Api()])) as instance:
        with pytest.raises(HostFunctionFailed) as info:
            instance.call("split", v)
        assert "result" in str(info.value.__cause__)


@settings(max_examples=25)
@given(st.integers(0, 5000))
def test_a_byte_list_reaches_the_guest(component: Component, n: int) -> None:
    """list<u8> results of every size (both sides of the small-list cut-off) arrive whole."""
    with Instance(component, gate=Gate([Api()])) as instance:
        total = sum(i % 256 for i in range(n))
        assert instance.call("repeat", n) == ((total << 16) + n) % 2**32
