"""Sandbox fixtures (the interpreter component itself is a session fixture of tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mighty.engine import Component


@pytest.fixture(scope="module")
def sandbox(interpreter: Component) -> Iterator[object]:
    """A sandbox with default limits and no tools, shared by a module's tests."""
    from mighty.sandbox import Sandbox

    with Sandbox() as box:
        yield box
