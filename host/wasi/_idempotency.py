"""Idempotency keys: the same key for the same side effect of the same message, however many
times the message runs (a durable agent's message re-run after a crash).

A durable agent's instance holds an :class:`IdempotencyKeys` in the :data:`IDEMPOTENCY_KEYS`
slot. The runtime sets ``message`` (the message's journal number; in a cluster, the durable
message's id, with the agent's cluster-wide name as ``agent``) before each ``handle`` call;
the agent's import log counts the message's imports in ``position`` (answered ones included, so
a re-run counts as the first run did). An outgoing HTTP request then carries
``Idempotency-Key: <key>`` (unless the guest set one), and a host tool that has a keyword
parameter named ``idempotency_key`` receives the key there: a server that honours the key sees
a request repeated by a recovery once.

Rejected: a random key per request (a re-run would send a new one), and a key from the request's
content (two equal requests of one message are two effects).
"""

from __future__ import annotations

import hashlib

from mighty.gate import Slot

__all__ = ["IDEMPOTENCY_KEYS", "IdempotencyKeys"]


class IdempotencyKeys:
    """Keys derived from (agent, message, import position); see the module."""

    __slots__ = ("agent", "message", "position")

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.message: int | str = 0
        self.position = 0

    def begin(self, message: int | str) -> None:
        """A message begins: its number (or id), and no import made yet."""
        self.message = message
        self.position = 0

    def key(self) -> str:
        """The key of the import being made now."""
        text = f"{self.agent}\0{self.message}\0{self.position}".encode()
        return hashlib.sha256(text).hexdigest()[:32]


IDEMPOTENCY_KEYS: Slot[IdempotencyKeys] = Slot("wasi.idempotency_keys")
"""Filled for durable agents' instances (mighty.agents); absent: no keys are added."""
