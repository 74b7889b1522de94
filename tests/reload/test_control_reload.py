"""`mty reload` against a running `mty run`, through its local control socket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty.cli import main
from mighty.control import request

ROOT = Path(__file__).resolve().parents[2]


def mty() -> list[str]:
    """The `mty` command of this environment."""
    script = Path(sys.executable).parent / "mty"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mighty.cli"]


@pytest.mark.slow
def test_mty_reload_swaps_a_running_system(counters: dict[str, Path], tmp_path: Path) -> None:
    """A compatible version swaps in and keeps the count; an incompatible one is refused."""
    sock = tmp_path / "control.sock"
    env = {**os.environ, "RUNTIME_CONTROL_SOCK": str(sock)}
    manifest = ROOT / "examples" / "agents" / "counter.toml"
    proc = subprocess.Popen(
        [*mty(), "run", str(manifest), "--keep-running", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        while not sock.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the control socket never appeared"
            time.sleep(0.1)
        assert request(sock, "ping") == {"pong": True}
        runner = CliRunner(env={"RUNTIME_CONTROL_SOCK": str(sock)})
        swapped = runner.invoke(
            main, ["reload", "counter", "--from", str(counters["v2"]), "--json"]
        )
        assert swapped.exit_code == 0, swapped.output
        result = json.loads(swapped.stdout)["result"]
        assert len(result["agents"]) == 1
        refused = runner.invoke(
            main, ["reload", "counter", "--from", str(counters["v3"]), "--json"]
        )
        assert refused.exit_code == 1
        error = json.loads(refused.stdout)["error"]
        assert error["kind"] == "reload_refused"
        assert "count" in error["message"]
        # A 1 GiB component is refused from its size, one typed line (it was read and
        # compiled: 2.16 GB of RSS, then "internal: MemoryError").
        huge = tmp_path / "huge.wasm"
        with huge.open("wb") as file:
            file.write(b"\x00asm\x0d\x00\x01\x00")
            file.truncate(1 << 30)
        too_big = runner.invoke(main, ["reload", "counter", "--from", str(huge), "--json"])
        assert too_big.exit_code == 1
        error = json.loads(too_big.stdout)["error"]
        assert error["kind"] != "internal" and "over the 268435456-byte limit" in error["message"]
        status = request(sock, "status")
        assert status["agents"][0]["handled"] >= 1
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    summary = json.loads(out.decode().strip().splitlines()[-1])
    # Stopped by Ctrl-C: reported as cancelled, exit 130, with the run's summary still in it.
    assert proc.returncode == 130, err.decode()
    assert summary["error"]["kind"] == "cancelled", err.decode()
    assert summary["events"]["reload.confirmed"] == 1
