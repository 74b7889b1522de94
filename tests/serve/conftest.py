"""tests/serve fixtures: the test guest (tests/serve/guest, the wasi:http proxy world), built
and compiled once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from mighty import Component

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def serve_guest_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/serve/guest/handler.py built with componentize-py (cached by content hash)."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("serve_guest") / "serve_guest.wasm"
    build_component(ROOT / "tests" / "serve" / "guest" / "handler.py", output=out)
    return out


@pytest.fixture(scope="session")
def serve_guest(serve_guest_wasm: Path) -> Component:
    """The test guest, loaded (and compiled) once."""
    return Component.load(serve_guest_wasm)
