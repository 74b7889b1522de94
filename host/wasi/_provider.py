"""WASI 0.2 as one gate provider: every interface a componentize-py guest imports."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

from mighty._errors import WrongType
from mighty.gate import Binding, GuestContext, ResourceKind
from mighty.wasi import _cli, _clocks, _filesystem, _io, _logging, _random, _sockets
from mighty.wasi._policy import Policy

__all__ = ["WasiProvider"]

_MODULES: tuple[ModuleType, ...] = (_io, _cli, _clocks, _random, _filesystem, _sockets, _logging)


class WasiProvider:
    """WASI in Python. Each instance's :class:`Policy` comes from ``ctx.state["wasi.policy"]``
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
        policy = ctx.state.setdefault("wasi.policy", Policy())
        if not isinstance(policy, Policy):
            raise WrongType(f"wasi.policy must be a Policy, got {type(policy).__name__}")
        for module in _MODULES:
            module.setup(ctx, policy)

    def teardown(self, ctx: GuestContext) -> None:
        """Close every host file descriptor the instance still holds."""
        _filesystem.close_all(ctx)
