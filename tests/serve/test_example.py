"""examples/serve: the example handler, built with mty build for the wasi:http/proxy world and
served as docs/serve.md and its README show (the `mty serve` + curl steps they cannot run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mighty import Component
from mighty.serve import Server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """examples/serve/handler.py built (WIT from examples/serve/wit) and loaded."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("serve_example") / "hello.wasm"
    build_component(ROOT / "examples" / "serve" / "handler.py", output=out)
    return Component.load(out)


@pytest.fixture
def client(example: Component) -> Iterator[httpx.Client]:
    """A client of the example, served on a free loopback port."""
    with Server(example).background() as live, httpx.Client(base_url=live.url) as session:
        yield session


def test_get_says_hello(client: httpx.Client) -> None:
    """`curl http://127.0.0.1:8080/` of the README."""
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain"
    assert response.text == "hello from a component\n"


def test_echo_streams_the_body_back(client: httpx.Client) -> None:
    """`curl --data-binary @README.md .../echo`: the body comes back as sent."""
    readme = (ROOT / "examples" / "serve" / "README.md").read_bytes()
    assert client.post("/echo", content=readme).content == readme


def test_anything_else_is_404(client: httpx.Client) -> None:
    """Another path or method is the handler's own 404."""
    assert client.get("/nothing").status_code == 404
    assert client.put("/echo", content=b"x").status_code == 404


def test_the_http_agents_example_answers_its_readme_curls(tmp_path: Path) -> None:
    """examples/http-agents under `mty run --http 127.0.0.1:0`: the README's curl steps, sent
    as curl sends them (a form content-type, a bare JSON body)."""
    import os
    import re
    import shutil
    import signal
    import subprocess
    import sys

    for name in ("http-agents", "agents"):
        shutil.copytree(ROOT / "examples" / name, tmp_path / name, ignore=_no_builds)
    manifest = str(tmp_path / "http-agents" / "mighty.toml")
    process = subprocess.Popen(
        [sys.executable, "-m", "mighty.cli", "run", manifest, "--http", "127.0.0.1:0", "-q"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    try:
        address = None
        for line in process.stderr:
            found = re.search(r"serving \[http\] on (http://\S+)", line)
            if found:
                address = found.group(1)
                break
        assert address is not None, "mty run never said where it serves"
        form = {"content-type": "application/x-www-form-urlencoded"}
        with httpx.Client(base_url=address, timeout=60.0) as curl:
            assert curl.put("/kv/answer", content=b"42", headers=form).json() == {"ok": True}
            assert curl.get("/kv/answer").json() == {"value": 42}
            assert curl.get("/kv").json() == {"size": 1}
            wrong = curl.post("/kv/answer")
            assert (wrong.status_code, wrong.json()) == (405, {"error": "method_not_allowed"})
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


def _no_builds(_directory: str, names: list[str]) -> list[str]:
    return [n for n in names if n in (".mighty", "__pycache__") or n.endswith(".wasm")]
