"""The trace package's compiled speedups (``_speedups.c``), when they are there and wanted.

``native`` is the compiled module (None when it was not built: no compiler, or a build with
``MIGHTY_PURE_PYTHON=1``). ``use_native()`` says whether to use it now: not when
``MIGHTY_PURE_PYTHON`` is set (to anything but ``0``). Each trace writer asks once, when it
is made, and its recordings follow it, so one process can write with either path (the tests
hold the two to the same bytes).
"""

from __future__ import annotations

import os

__all__ = ["native", "use_native"]

try:
    from mighty.trace import _speedups as native
except ImportError:  # not built: the pure-Python paths
    native = None  # type: ignore[assignment]


def use_native() -> bool:
    """Whether the compiled paths are there and wanted."""
    return native is not None and os.environ.get("MIGHTY_PURE_PYTHON", "") in ("", "0")
