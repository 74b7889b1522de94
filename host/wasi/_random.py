"""``wasi:random`` 0.2: random, insecure and insecure-seed.

Without ``Policy.seed`` every byte comes from the OS (``os.urandom``). With a seed the bytes are
deterministic: call number ``k`` (counting from 0 over ``random`` and ``insecure`` together, in
the order the guest makes them) returns ``shake_256(b"mighty.random\\0" + str(seed) + b"\\0" +
str(k)).digest(len)``; ``insecure-seed`` returns the two little-endian u64 halves of
``shake_256(b"mighty.insecure-seed\\0" + str(seed)).digest(16)``, the same for every call. SHAKE
is specified byte for byte by FIPS 202, so the stream never changes with the Python version
(``random.Random`` makes no such promise across versions).

A request for more than ``Policy.max_read`` bytes stops the guest with :class:`RandomTooLong`:
the WIT promises exactly ``len`` bytes, so returning fewer would break the contract, and
producing what an absurd length asks would exhaust the host.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from mighty.gate import Binding, GuestContext, GuestViolation, ResourceKind, Slot
from mighty.wasi._policy import Policy

__all__ = ["RandomTooLong", "bindings", "resources", "setup"]

_STATE: Slot[_RandomState] = Slot("wasi.random")


class RandomTooLong(GuestViolation):
    """The guest asked for more random bytes in one call than the policy's ``max_read``; the
    guest traps (returning fewer bytes would break the interface's contract)."""


@dataclass(slots=True)
class _RandomState:
    policy: Policy
    calls: int = 0
    insecure_seed: tuple[int, int] | None = field(default=None)

    def take(self, length: int) -> bytes:
        if length > self.policy.max_read:
            raise RandomTooLong(
                f"the guest asked for {length} random bytes in one call; at most "
                f"{self.policy.max_read} (Policy.max_read) are allowed"
            )
        seed = self.policy.seed
        if seed is None:
            return os.urandom(length)
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
    return _state(ctx).take(length)


def _u64(ctx: GuestContext) -> int:
    return int.from_bytes(_state(ctx).take(8), "little")


def _insecure_seed(ctx: GuestContext) -> tuple[int, int]:
    return _state(ctx).seed_pair()


def bindings() -> list[Binding]:
    """Every function of wasi:random/random, insecure and insecure-seed 0.2."""
    return [
        Binding("wasi:random/random", "get-random-bytes", _bytes),
        Binding("wasi:random/random", "get-random-u64", _u64),
        Binding("wasi:random/insecure", "get-insecure-random-bytes", _bytes),
        Binding("wasi:random/insecure", "get-insecure-random-u64", _u64),
        Binding("wasi:random/insecure-seed", "insecure-seed", _insecure_seed),
    ]
