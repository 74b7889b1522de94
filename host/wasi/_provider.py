"""WASI 0.2 as one gate provider: every interface a componentize-py guest imports."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

from mighty._errors import WrongType
from mighty.gate import Binding, GuestContext, ResourceKind, Slot
from mighty.wasi import _cli, _clocks, _filesystem, _http, _io, _logging, _random, _sockets
from mighty.wasi._policy import Policy

__all__ = ["WASI_POLICY", "WasiProvider"]

WASI_POLICY: Slot[Policy] = Slot("wasi.policy")
"""The slot of an instance's WASI :class:`Policy` (seeded by ``Instance``; default: none)."""

_MODULES: tuple[ModuleType, ...] = (
    _io,
    _cli,
    _clocks,
    _random,
    _filesystem,
    _sockets,
    _logging,
    _http,
)


class WasiProvider:
    """WASI in Python. Each instance's :class:`Policy` comes from its :data:`WASI_POLICY` slot
    (the default grants nothing), so one provider, and one linker per component, serves every
    instance whatever its policy."""

    name = "wasi"

    def resources(self) -> Iterable[ResourceKind]:
        for module in _MODULES:
            yield from module.resources()

    def bindings(self) -> Iterable[Binding]:
        for module in _MODULES:
            yield from module.bindings()

    def setup(self, ctx: GuestContext) -> None:
        policy = ctx.find(WASI_POLICY)
        if policy is None:
            policy = Policy()
            ctx.put(WASI_POLICY, policy)
        elif not isinstance(policy, Policy):  # a seed is typed only where Slot.of was checked
            raise WrongType(f"wasi.policy must be a Policy, got {type(policy).__name__}")
        for module in _MODULES:
            module.setup(ctx, policy)

    def teardown(self, ctx: GuestContext) -> None:
        """Close every host file descriptor the instance still holds; cancel its requests."""
        _filesystem.close_all(ctx)
        _http.close_all(ctx)
