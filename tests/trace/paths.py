"""Choosing the trace writer's path in a test: the compiled one (host/trace/_speedups.c) or
the pure-Python one it is the compiled form of (MIGHTY_PURE_PYTHON)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

PATHS = pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure"])
"""Runs a test taking ``pure`` on both paths."""


@contextlib.contextmanager
def pure_python(pure: bool) -> Iterator[None]:
    """Writers and recordings made inside use the pure-Python paths (``pure``) or the
    compiled ones (MIGHTY_PURE_PYTHON unset)."""
    saved = os.environ.pop("MIGHTY_PURE_PYTHON", None)
    if pure:
        os.environ["MIGHTY_PURE_PYTHON"] = "1"
    try:
        yield
    finally:
        os.environ.pop("MIGHTY_PURE_PYTHON", None)
        if saved is not None:
            os.environ["MIGHTY_PURE_PYTHON"] = saved
