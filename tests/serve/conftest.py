"""tests/serve fixtures: the test guest (tests/serve/guest, the wasi:http proxy world, with the
agent SDK's HTTP client on its path), built and compiled once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from mighty import Component

ROOT = Path(__file__).resolve().parents[2]
SDK = [ROOT / "guests" / "sdk"]  # the guest's /fetch uses mighty_agent.http


@pytest.fixture(scope="session")
def serve_guest_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/serve/guest/handler.py built with componentize-py (cached by content hash)."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("serve_guest") / "serve_guest.wasm"
    build_component(ROOT / "tests" / "serve" / "guest" / "handler.py", output=out, python_path=SDK)
    return out


@pytest.fixture(scope="session")
def serve_guest(serve_guest_wasm: Path) -> Component:
    """The test guest, loaded (and compiled) once."""
    return Component.load(serve_guest_wasm)


@pytest.fixture(scope="session")
def serve_guest_v2_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test guest with /hello answering ``hello v2``: the new version of a hot swap."""
    import shutil

    from mighty.build import build_component

    source = tmp_path_factory.mktemp("serve_guest_v2") / "guest"
    shutil.copytree(ROOT / "tests" / "serve" / "guest", source)
    handler = source / "handler.py"
    text = handler.read_text()
    assert 'send(response_out, 200, b"hello")' in text
    handler.write_text(text.replace('200, b"hello")', '200, b"hello v2")'))
    out = source.parent / "serve_guest_v2.wasm"
    build_component(handler, output=out, python_path=SDK)
    return out


@pytest.fixture(scope="session")
def serve_guest_v2(serve_guest_v2_wasm: Path) -> Component:
    """The v2 test guest, loaded once."""
    return Component.load(serve_guest_v2_wasm)


@pytest.fixture(scope="session")
def front_agent_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/serve/agents/front.py (the HTTP front's test agent) built once (cached by content)."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("front_agent") / "front.wasm"
    build_component(
        ROOT / "tests" / "serve" / "agents" / "front.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=SDK,
    )
    return out
