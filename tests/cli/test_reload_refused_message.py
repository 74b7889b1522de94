"""`mty reload` refused says why once (not "reload refused: reload_refused: ..."), and
`mty ask` reaches the agents of a running `mty run --keep-running`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from mighty.cli import main
from tests.cluster.conftest import Mty

ROOT = Path(__file__).resolve().parents[2]


def test_refused_reload_and_ask_on_a_running_system(
    tmp_path: Path, wat: Callable[[str], bytes]
) -> None:
    """A component without a state schema is refused with the reason alone; asks still work."""
    fixtures = ROOT / "tests" / "fixtures"
    (tmp_path / "echo.wasm").write_bytes(wat((fixtures / "echo_agent.wat").read_text()))
    other = tmp_path / "other.wasm"
    source = (fixtures / "random_sum.wat").read_text()
    other.write_bytes(wat(source.replace("CALLS_EXTRA", "0").replace("XOR", "0")))
    manifest = tmp_path / "mighty.toml"
    manifest.write_text(
        '[agents.echo]\ncomponent = "echo.wasm"\n\n'
        '[supervisor]\nchildren = [{ name = "e", type = "echo" }]\n'
    )
    with tempfile.TemporaryDirectory(prefix="mty-reload-", dir="/tmp") as sockets:
        os.chmod(sockets, 0o700)
        sock = str(Path(sockets) / "c.sock")
        run = Mty("run", str(manifest), "--keep-running", env={"RUNTIME_CONTROL_SOCK": sock})
        try:
            run.wait_line("running; Ctrl-C to stop")
            runner = CliRunner()
            refused = runner.invoke(
                main, ["reload", "echo", "--from", str(other), "--socket", sock]
            )
            assert refused.exit_code == 1
            assert "mty: reload refused: echo: the new component has no usable state schema" in (
                refused.stderr
            )
            assert "reload_refused" not in refused.stderr
            asked = runner.invoke(main, ["ask", "e", "hi", '"there"', "--socket", sock])
            assert asked.exit_code == 0, asked.output
            assert asked.stdout == '"there"\n'
        finally:
            run.finish()
