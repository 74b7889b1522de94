"""The relay test agent (asks or tells along a path, emits, logs), built once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mighty import Component

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def relay_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/telemetry/guests/relay.py built with `mty build` (cached by content)."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("relay") / "relay.wasm"
    build_component(
        ROOT / "tests" / "telemetry" / "guests" / "relay.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return out


@pytest.fixture(scope="session")
def relay(relay_wasm: Path) -> Component:
    return Component.load(relay_wasm)


@pytest.fixture(scope="session")
def echo_agent(wat: Callable[[str], bytes]) -> Component:
    """The one-page WAT echo agent (instant to start)."""
    return Component.load(wat((ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()))
