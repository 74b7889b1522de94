"""A host tool the test agent calls to wait until the test lets it go: the test, not the
clock, decides how long a handler runs (entered/release events per name)."""

from __future__ import annotations

import threading
from collections import defaultdict

__all__ = ["entered", "gate", "release", "reset"]

_LOCK = threading.Lock()
_ENTERED: dict[str, threading.Event] = defaultdict(threading.Event)
_RELEASE: dict[str, threading.Event] = defaultdict(threading.Event)


def _event(table: dict[str, threading.Event], name: str) -> threading.Event:
    with _LOCK:
        return table[name]


def gate(name: str) -> dict[str, object]:
    """Say the handler is in, then wait until the test releases ``name`` (at most 300 s)."""
    _event(_ENTERED, name).set()
    released = _event(_RELEASE, name).wait(300)
    return {"held": name, "released": released}


def entered(name: str) -> threading.Event:
    """Set once a handler waits in ``gate(name)``."""
    return _event(_ENTERED, name)


def release(name: str) -> None:
    """Let every handler waiting in ``gate(name)`` go."""
    _event(_RELEASE, name).set()


def reset() -> None:
    """Forget every name (between tests)."""
    with _LOCK:
        for event in _RELEASE.values():
            event.set()
        _ENTERED.clear()
        _RELEASE.clear()
