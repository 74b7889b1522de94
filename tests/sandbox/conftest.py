"""Sandbox fixtures: the interpreter component is built (or taken from the cache) once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mighty.engine import Component


@pytest.fixture(scope="session")
def interpreter() -> Component:
    """The code-mode interpreter, built with componentize-py and compiled once per session."""
    from mighty.sandbox import interpreter_component

    return interpreter_component()


@pytest.fixture(scope="module")
def sandbox(interpreter: Component) -> Iterator[object]:
    """A sandbox with default limits and no tools, shared by a module's tests."""
    from mighty.sandbox import Sandbox

    with Sandbox() as box:
        yield box
