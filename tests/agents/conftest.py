"""Agent guests: the WAT echo agent (instant) and the SDK examples (built once per session)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mighty import Component

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def echo_agent(wat: Callable[[str], bytes]) -> Component:
    """A one-page WAT agent that replies with the body it got."""
    return Component.load(wat((ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()))


def _build(name: str, tmp: Path) -> Component:
    from mighty.build import build_component

    out = tmp / f"{name}.wasm"
    build_component(
        ROOT / "examples" / "agents" / f"{name}.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return Component.load(out)


@pytest.fixture(scope="session")
def pingpong(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """The ping-pong example agent."""
    return _build("pingpong", tmp_path_factory.mktemp("pingpong"))


@pytest.fixture(scope="session")
def kvstore(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """The key-value store example agent (crashes on request)."""
    return _build("kvstore", tmp_path_factory.mktemp("kvstore"))


@pytest.fixture(scope="session")
def wordcount(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """The word-count example agent."""
    return _build("wordcount", tmp_path_factory.mktemp("wordcount"))
