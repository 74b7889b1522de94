"""``wasi:random`` 0.2: random, insecure and insecure-seed.

Without ``Policy.seed`` every byte comes from the OS (``os.urandom``). With a seed the bytes are
deterministic: call number ``k`` (counting from 0 over ``random`` and ``insecure`` together, in
the order the guest makes them) returns ``shake_256(b"mighty.random\\0" + str(seed) + b"\\0" +
str(k)).digest(len)``; ``insecure-seed`` returns the two little-endian u64 halves of
``shake_256(b"mighty.insecure-seed\\0" + str(seed)).digest(16)``, the same for every call. SHAKE
is specified byte for byte by FIPS 202, so the stream never changes with the Python version
(``random.Random`` makes no such promise across versions).

Unseeded bytes are drawn from the OS in blocks of :data:`POOL_SIZE` per instance and handed out
in order, each byte once (one ``getrandom`` call costs more than the rest of a small import); a
request longer than :data:`POOL_DIRECT` goes to the OS directly. A forked child never hands out
its parent's pooled bytes: the pool is dropped in the child (``os.register_at_fork``). This is
what wasmtime's own WASI does too (a user-space generator seeded from the OS).

A request for more than ``Policy.max_read`` bytes stops the guest with :class:`RandomTooLong`:
the WIT promises exactly ``len`` bytes, so returning fewer would break the contract, and
producing what an absurd length asks would exhaust the host.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from dataclasses import dataclass, field

from mighty.gate import Binding, Direct, GuestContext, GuestViolation, ResourceKind, Slot
from mighty.wasi._policy import Policy

__all__ = ["POOL_DIRECT", "POOL_SIZE", "RandomTooLong", "bindings", "resources", "setup"]

_STATE: Slot[_RandomState] = Slot("wasi.random")
POOL_SIZE = 4096
"""Bytes an unseeded instance draws from the OS at a time."""
POOL_DIRECT = 256
"""A request longer than this goes to the OS directly (not through the pool)."""
_POOLS: weakref.WeakSet[_RandomState] = weakref.WeakSet()
"""Every live instance's state with a pool: a forked child drops them all."""


def _after_fork() -> None:
    for state in list(_POOLS):
        state.pool = b""
        state.pos = 0


os.register_at_fork(after_in_child=_after_fork)
_urandom = os.urandom


class RandomTooLong(GuestViolation):
    """The guest asked for more random bytes in one call than the policy's ``max_read``; the
    guest traps (returning fewer bytes would break the interface's contract)."""


@dataclass(slots=True, weakref_slot=True, eq=False)
class _RandomState:
    policy: Policy
    calls: int = 0
    insecure_seed: tuple[int, int] | None = field(default=None)
    pooled: int = -1
    """The longest request the pool serves (-1 when seeded: every byte is derived)."""
    pool: bytes = b""
    pos: int = 0

    def __post_init__(self) -> None:
        if self.policy.seed is None:
            self.pooled = min(POOL_DIRECT, self.policy.max_read)
            _POOLS.add(self)

    def fresh(self, length: int) -> bytes:
        """``length`` (at most ``pooled``) unseeded bytes from the pool."""
        pos = self.pos
        end = pos + length
        if end > len(self.pool):
            self.pool = _urandom(POOL_SIZE)
            pos, end = 0, length
        self.pos = end
        return self.pool[pos:end]

    def take(self, length: int) -> bytes:
        if length > self.policy.max_read:
            raise RandomTooLong(
                f"the guest asked for {length} random bytes in one call; at most "
                f"{self.policy.max_read} (Policy.max_read) are allowed"
            )
        seed = self.policy.seed
        if seed is None:
            return self.fresh(length) if length <= self.pooled else _urandom(length)
        counter = self.calls
        self.calls += 1
        label = b"mighty.random\0" + str(seed).encode() + b"\0" + str(counter).encode()
        return hashlib.shake_256(label).digest(length)

    def seed_pair(self) -> tuple[int, int]:
        if self.insecure_seed is None:
            seed = self.policy.seed
            if seed is None:
                raw = os.urandom(16)
            else:
                label = b"mighty.insecure-seed\0" + str(seed).encode()
                raw = hashlib.shake_256(label).digest(16)
            self.insecure_seed = (
                int.from_bytes(raw[:8], "little"),
                int.from_bytes(raw[8:], "little"),
            )
        return self.insecure_seed


def _state(ctx: GuestContext) -> _RandomState:
    return ctx.slot(_STATE)


def resources() -> list[ResourceKind]:
    """None: wasi:random has no resources."""
    return []


def setup(ctx: GuestContext, policy: Policy) -> None:
    """A fresh generator per instance (a seeded one restarts its stream)."""
    ctx.put(_STATE, _RandomState(policy))


def _bytes(ctx: GuestContext, length: int) -> bytes:
    return _bytes_direct(ctx.slot(_STATE), length)


def _bytes_direct(state: _RandomState, length: int) -> bytes:
    """``_bytes`` on the instance's state (the gate's fused frame calls it)."""
    if length <= state.pooled:
        # fresh(), inline while the pool lasts
        pos = state.pos
        end = pos + length
        if end <= len(state.pool):
            state.pos = end
            return state.pool[pos:end]
        return state.fresh(length)
    return state.take(length)


def _u64_direct(state: _RandomState) -> int:
    """``_u64`` on the instance's state."""
    return int.from_bytes(state.fresh(8) if state.pooled >= 8 else state.take(8), "little")


def _u64(ctx: GuestContext) -> int:
    state = ctx.slot(_STATE)
    return int.from_bytes(state.fresh(8) if state.pooled >= 8 else state.take(8), "little")


def _insecure_seed(ctx: GuestContext) -> tuple[int, int]:
    return _state(ctx).seed_pair()


_BYTES = Direct(_STATE, _bytes_direct)
_U64 = Direct(_STATE, _u64_direct)


def bindings() -> list[Binding]:
    """Every function of wasi:random/random, insecure and insecure-seed 0.2."""
    return [
        Binding("wasi:random/random", "get-random-bytes", _bytes, _BYTES),
        Binding("wasi:random/random", "get-random-u64", _u64, _U64),
        Binding("wasi:random/insecure", "get-insecure-random-bytes", _bytes, _BYTES),
        Binding("wasi:random/insecure", "get-insecure-random-u64", _u64, _U64),
        Binding("wasi:random/insecure-seed", "insecure-seed", _insecure_seed),
    ]
