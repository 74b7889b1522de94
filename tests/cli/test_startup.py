"""`mty` starts without importing what its command does not need (issue 39 #10: `mty --version`
took 0.65-0.94 s, most of it importing the agent runtime and the manifest's models)."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import sys
import mighty.cli
heavy = ["mighty.agents", "mighty.cluster", "mighty.capabilities", "mighty.sandbox",
         "mighty.serve", "mighty.eval", "pydantic", "nats", "mcp"]
print(" ".join(name for name in heavy if name in sys.modules) or "none")
"""


def test_the_command_line_loads_no_runtime_until_a_command_needs_one() -> None:
    """Importing the CLI (what `mty --version` and `mty --help` pay) loads none of the layers
    that only some commands use."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["none"]


def test_mty_version_answers() -> None:
    """`mty --version` prints mighty's version and the pinned runtime's, and exits 0."""
    import mighty

    done = subprocess.run(
        [sys.executable, "-m", "mighty.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"mty (mighty) {mighty.__version__}"
    assert lines[1].startswith("wasmtime ")
