"""``mty serve`` as a user runs it: a real process on loopback, answered by a real client,
recorded, stopped by SIGTERM (gracefully: exit 0), and its traces replayed by ``mty replay``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from mighty._errors import BadInput
from mighty.cli import main
from mighty.cli._serve import parse_listen
from mighty.control import request

MTY = [sys.executable, "-m", "mighty.cli"]


def test_mty_serve_answers_records_and_stops_on_sigterm(
    serve_guest_wasm: Path, tmp_path: Path
) -> None:
    """mty serve prints its address, answers, records one trace per request, exits 0 on
    SIGTERM; mty replay replays a recorded request."""
    traces = tmp_path / "traces"
    process = subprocess.Popen(
        [*MTY, "serve", str(serve_guest_wasm), "--listen", "127.0.0.1:0", "--record", str(traces)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    try:
        address = None
        for line in process.stderr:
            found = re.search(r"serving .* on (http://\S+)", line)
            if found:
                address = found.group(1)
                break
        assert address is not None
        with httpx.Client(base_url=address, timeout=60.0) as client:
            assert client.get("/hello").text == "hello"
            assert client.post("/echo", content=b"via the cli").text == "got 11 bytes: via the cli"
        process.send_signal(signal.SIGTERM)
        rest = process.stderr.read()
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
    assert "GET /hello 200" in rest and "served 2 requests" in rest
    replayed = subprocess.run(
        [*MTY, "replay", str(traces / "request-000002.bin")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.startswith("instance 1: 1 export call(s)")


def test_mty_reload_swaps_the_served_component(
    serve_guest_wasm: Path, serve_guest_v2_wasm: Path, tmp_path: Path
) -> None:
    """With --control, mty reload http --from V2 swaps the component of a running mty serve:
    the next request runs v2."""
    control = tmp_path / "control.sock"
    process = subprocess.Popen(
        [
            *MTY,
            "serve",
            str(serve_guest_wasm),
            "--listen",
            "127.0.0.1:0",
            "--control",
            str(control),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    try:
        address = _address(process.stderr)
        with httpx.Client(base_url=address, timeout=60.0) as client:
            assert client.get("/hello").text == "hello"
            swapped = subprocess.run(
                [
                    *MTY,
                    "reload",
                    "http",
                    "--from",
                    str(serve_guest_v2_wasm),
                    "--socket",
                    str(control),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            assert swapped.returncode == 0, swapped.stderr
            assert swapped.stdout.startswith("http: swapped 1 agent(s) to ")
            assert client.get("/hello").text == "hello v2"
        status = request(str(control), "status")
        assert status["requests"] == 2 and status["statuses"] == {"200": 2}
        for _ in range(600):  # a guest may still be returning after its response went out
            if request(str(control), "status")["in_flight"] == 0:
                break
            threading.Event().wait(0.05)
        else:
            raise AssertionError("a request stayed in flight")
        refused = subprocess.run(
            [*MTY, "reload", "kv", "--from", str(serve_guest_v2_wasm), "--socket", str(control)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert refused.returncode == 1
        assert "mty reload http --from NEW.wasm" in refused.stderr
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


def _address(stderr: Any) -> str:
    for line in stderr:
        found = re.search(r"serving .* on (http://\S+)", line)
        if found:
            return found.group(1)
    raise AssertionError("mty serve never said where it serves")


def test_off_loopback_needs_a_token(tmp_path: Path) -> None:
    """Listening off loopback without --token-file is refused before anything is loaded."""
    result = CliRunner().invoke(main, ["serve", str(tmp_path / "x.wasm"), "--listen", "0.0.0.0:0"])
    assert result.exit_code == 2
    assert "off loopback: give --token-file" in result.output


@given(host=st.sampled_from(["127.0.0.1", "localhost", "[::1]"]), port=st.integers(0, 65535))
def test_parse_listen_round_trips(host: str, port: int) -> None:
    """HOST:PORT parses to the host (brackets dropped) and the port."""
    assert parse_listen(f"{host}:{port}") == (host.strip("[]"), port)


@given(text=st.text(max_size=12).filter(lambda t: not re.fullmatch(r".+:\d{1,5}", t)))
def test_parse_listen_refuses_what_is_not_host_port(text: str) -> None:
    """Anything but HOST:PORT is a BadInput."""
    try:
        parse_listen(text)
    except BadInput:
        return
    raise AssertionError(f"{text!r} was accepted")
