"""Idempotency keys: the same key for the same side effect of the same message, however many
times the message runs (a durable agent's message re-run after a crash).

A durable agent's instance holds an :class:`IdempotencyKeys` in the :data:`IDEMPOTENCY_KEYS`
slot. The runtime sets ``message`` (the message's journal number; in a cluster, the durable
message's id, with the agent's cluster-wide name as ``agent``) before each ``handle`` call;
the agent's import log counts the message's keyed imports in ``position`` (:meth:`step`: an HTTP
request's ``handle`` and a tool call, answered ones included, so a re-run counts as the first
run did). An outgoing HTTP request then carries
``Idempotency-Key: <key>`` (unless the guest set one), and a host tool that has a keyword
parameter named ``idempotency_key`` receives the key there: a server that honours the key sees
a request repeated by a recovery once.

Rejected: a random key per request (a re-run would send a new one), a key from the request's
content (two equal requests of one message are two effects), and counting every import in
``position`` (an HTTP exchange's polls and body reads vary from run to run: a response ready at
once is one ``get``, a slow one a ``subscribe``, a ``block`` and a ``get``; a recovery answering
from the log then gave the request in flight another key than the crashed run had sent).
"""

from __future__ import annotations

import hashlib

from mighty.gate import Slot

__all__ = ["IDEMPOTENCY_KEYS", "KEYED", "IdempotencyKeys"]

KEYED = frozenset({("wasi:http/outgoing-handler", "handle"), ("mighty:agent/tools", "call")})
"""The imports (interface without its version, function) a key may be given to: an HTTP
request, a tool call (MCP tools included)."""


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

    def step(self, interface: str, function: str) -> None:
        """An import of the message is being made: a keyed one (:data:`KEYED`) is the next
        position."""
        if (interface.partition("@")[0], function) in KEYED:
            self.position += 1

    def key(self) -> str:
        """The key of the import being made now."""
        text = f"{self.agent}\0{self.message}\0{self.position}".encode()
        return hashlib.sha256(text).hexdigest()[:32]


IDEMPOTENCY_KEYS: Slot[IdempotencyKeys] = Slot("wasi.idempotency_keys")
"""Filled for durable agents' instances (mighty.agents); absent: no keys are added."""
