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


_HANDLE = (
    '(func (export "handle") (param i32 i32 i32 i32 i32 i32) (result i32)'
    " (local $r i32) (local $name i32)"
)
# Inserted at the top of the echo agent's handle: a message named "crash" (5 bytes, 'c' first)
# traps, as a guest bug would; any other message is echoed.
_TRAP_ON_CRASH = """
      (if (i32.and (i32.eq (local.get 3) (i32.const 5))
                   (i32.eq (i32.load8_u (local.get 2)) (i32.const 0x63)))
        (then unreachable))"""


@pytest.fixture(scope="session")
def crasher_wasm(wat: Callable[[str], bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The WAT echo agent that traps on a message named "crash", written to a file."""
    text = (ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()
    assert text.count(_HANDLE) == 1, "the echo agent's handle changed: update _HANDLE"
    path = tmp_path_factory.mktemp("crasher") / "crasher.wasm"
    path.write_bytes(wat(text.replace(_HANDLE, _HANDLE + _TRAP_ON_CRASH)))
    return path


@pytest.fixture(scope="session")
def crasher_agent(crasher_wasm: Path) -> Component:
    """The WAT echo agent that traps on a message named "crash" (instant to start)."""
    return Component.load(crasher_wasm)


def _build_path(name: str, tmp: Path, source: Path = ROOT / "examples" / "agents") -> Path:
    """``source/name.py`` (an example agent by default) built into ``tmp``."""
    from mighty.build import build_component

    out = tmp / f"{name}.wasm"
    build_component(
        source / f"{name}.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return out


GUESTS = ROOT / "tests" / "agents" / "guests"
"""The agents written for these tests (``_build_path(name, tmp, GUESTS)``)."""


def _build(name: str, tmp: Path) -> Component:
    return Component.load(_build_path(name, tmp))


@pytest.fixture(scope="session")
def counter_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The counter example agent (its "work" message is a slow handler), as a file."""
    return _build_path("counter", tmp_path_factory.mktemp("counter"))


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
