"""Tests of mighty.wasi; ``make_ctx`` and ``call`` drive binding functions without wasm."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import wasmtime

from mighty.budget import CallScope
from mighty.engine import get_engine
from mighty.gate import UNSCOPED, Binding, Gate, GuestContext, Handle, ResourceKind, Seed
from mighty.wasi import _cli, _clocks, _http, _io, _random, _sockets
from mighty.wasi._policy import Policy

_MODULES = (_io, _cli, _clocks, _random, _sockets, _http)


class _Modules:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def resources(self) -> list[ResourceKind]:
        return [kind for m in _MODULES for kind in m.resources()]

    def bindings(self) -> list[Binding]:
        return [b for m in _MODULES for b in m.bindings()]

    def setup(self, ctx: GuestContext) -> None:
        for m in _MODULES:
            m.setup(ctx, self.policy)


def make_ctx(policy: Policy | None = None, seed: Iterable[Seed] = ()) -> GuestContext:
    """A real GuestContext with every module of ours set up under ``policy`` (``seed``: slots
    filled before setup, e.g. an output sink)."""
    return Gate([_Modules(policy or Policy())]).context(wasmtime.Store(get_engine()), seed=seed)


def call(ctx: GuestContext, interface: str, name: str, *args: Any) -> Any:
    """Call the binding ``interface#name`` as the gate would (args already host objects), in
    the context's call scope, or in one of a minute (as a guest call) if it has none."""
    for module in _MODULES:
        for binding in module.bindings():
            if binding.interface == interface and binding.name == name:
                if ctx.scope is not UNSCOPED:
                    return binding.fn(ctx, *args)
                ctx.scope = CallScope(60.0, None)
                try:
                    return binding.fn(ctx, *args)
                finally:
                    ctx.scope = UNSCOPED
    raise KeyError(f"{interface}#{name}")


def obj(ctx: GuestContext, handle: Handle) -> Any:
    """The host object behind a handle a binding returned."""
    return ctx.get(handle.kind, handle.rep)
