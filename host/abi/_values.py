"""Explicit Python values for the WIT cases that plain Python types cannot tell apart.

wasmtime-py guesses which case of a ``result`` or ``variant`` a Python value means from its type,
so ``result<u32, u32>`` cannot say ``err(1)``. Here every result is ``Ok``/``Err``, every variant
is ``Variant``, and an ``option`` whose payload is itself an option marks its outer ``some`` with
``Some`` (``option<option<u8>>``: ``None``, ``Some(None)``, ``Some(5)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Err", "Ok", "Some", "Variant"]


@dataclass(frozen=True, slots=True)
class Ok:
    """The ``ok`` case of a WIT ``result``; ``value`` is ``None`` when the case has no payload."""

    value: Any = None


@dataclass(frozen=True, slots=True)
class Err:
    """The ``err`` case of a WIT ``result``; ``value`` is ``None`` when the case has no payload."""

    value: Any = None


@dataclass(frozen=True, slots=True)
class Variant:
    """One case of a WIT ``variant``; ``value`` is ``None`` when the case has no payload."""

    case: str
    value: Any = None


@dataclass(frozen=True, slots=True)
class Some:
    """The ``some`` case of an ``option``; required when the payload is itself an option."""

    value: Any
