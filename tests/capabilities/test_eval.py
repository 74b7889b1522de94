"""`mty eval` scores other builds of an agent on its recorded tool traffic: the same calls are
answered from the trace (keyword order does not matter), a call the trace never saw is a
divergence naming it. No tool is imported and no MCP server runs during the suite."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLBOX = ROOT / "examples" / "agents" / "toolbox"

_SUITE = """
policy = "strict"

[[case]]
name = "plan"
trace = "run.bin"
agent = "toolbox"

[[member]]
name = "reordered"
source = "reordered.py"

[[member]]
name = "other-note"
source = "other_note.py"

[[compare]]
name = "equal"
id = "reply"
on = "result"
"""


def _variant(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


def test_eval_answers_tool_calls_from_the_recording(tmp_path: Path) -> None:
    """The same calls with keywords reordered pass; reading another note diverges, named."""
    work = tmp_path / "toolbox"
    shutil.copytree(TOOLBOX, work, ignore=shutil.ignore_patterns(".mighty", "*.bin"))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    mty = [sys.executable, "-m", "mighty.cli"]
    run = subprocess.run(
        [*mty, "run", "mighty.toml", "--record", "run.bin"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    source = (work / "toolbox.py").read_text()
    (work / "reordered.py").write_text(
        _variant(
            source,
            'tools.notes.write(name=body["note"], text=body["text"])',
            'tools.notes.write(text=body["text"], name=body["note"])',
        )
    )
    (work / "other_note.py").write_text(
        _variant(source, 'tools.notes.read(name=body["note"])', 'tools.notes.read(name="x.txt")')
    )
    (work / "suite.toml").write_text(_SUITE)
    # The MCP server cannot start during the suite: its program is gone.
    (work / "notes_server.py").unlink()
    done = subprocess.run(
        [*mty, "eval", "suite.toml", "--json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    report = json.loads(done.stdout)
    verdicts = {cell["member"]: cell for cell in report["cells"]}
    assert verdicts["reordered"]["verdict"] == "pass", verdicts["reordered"]
    other = verdicts["other-note"]
    assert other["verdict"] == "diverged", other
    assert "mighty:agent/tools" in json.dumps(other)
    assert done.returncode == 1
