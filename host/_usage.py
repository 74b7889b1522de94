"""What a call used: a value shared by the error root (a failed call carries it) and budgets.

It lives in the root, beside ``_errors``, so that the errors can name it without importing the
budget layer above them (``mighty.budget`` re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Usage"]


@dataclass(frozen=True, slots=True)
class Usage:
    """What a finished (or failed) call used."""

    fuel: int
    memory_peak: int
    wall_time: float

    def to_json(self) -> dict[str, float | int]:
        return {
            "fuel": self.fuel,
            "memory_peak": self.memory_peak,
            "wall_ms": round(self.wall_time * 1000, 3),
        }
