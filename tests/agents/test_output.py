"""What agents write: log() and print() lines streamed per agent, kept in a bounded tail."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mighty import Component
from mighty.agents import AgentOutput, AgentType, Runtime
from mighty.agents.hosting import LineSplitter, OutputTail

GUESTS = Path(__file__).resolve().parent / "guests"
ROOT = Path(__file__).resolve().parents[2]
MTY = str(Path(sys.executable).parent / "mty")


@pytest.fixture(scope="session")
def chatty_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chatty test agent (log() at every level, print() to stdout and stderr), built once."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("chatty") / "chatty.wasm"
    build_component(
        GUESTS / "chatty.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return out


def test_line_splitter_holds_partial_lines() -> None:
    """Chunks become whole lines; a partial line waits for its newline or a flush."""
    lines: list[str] = []
    splitter = LineSplitter(lines.append)
    splitter.feed(b"one\ntw")
    assert lines == ["one"]
    splitter.feed(b"o\r\nthr")
    splitter.flush()
    assert lines == ["one", "two", "thr"]


def test_output_tail_is_bounded() -> None:
    """The tail keeps the last lines within its line and size bounds and counts the rest."""
    tail = OutputTail(lines=3, max_bytes=10)
    for i in range(5):
        tail.add(AgentOutput("a:1", "stdout", f"l{i}"))
    assert [o.text for o in tail.items()] == ["l2", "l3", "l4"] and tail.dropped == 2
    tail.add(AgentOutput("a:1", "stdout", "x" * 9))
    assert [o.text for o in tail.items()] == ["x" * 9] and tail.dropped == 5


def test_runtime_streams_log_and_print(chatty_wasm: Path) -> None:
    """on_output hears log() lines with their level and print() lines per stream, live."""
    heard: list[AgentOutput] = []
    lock = threading.Lock()

    def hear(item: AgentOutput) -> None:
        with lock:
            heard.append(item)

    with Runtime(workers=1, on_output=hear) as rt:
        rt.register(AgentType("chatty", Component.load(chatty_wasm)))
        address = rt.spawn("chatty")
        assert rt.ask(address, "talk") == {"said": 1}
        process = rt.process(address)
        tail = [(o.stream, o.level, o.text) for o in process.output.items()]
    got = [(o.stream, o.level, o.text) for o in heard]
    assert got == tail
    assert got == [
        ("log", "info", "chatty is up"),
        ("log", "debug", "debug detail 1"),
        ("log", "info", "talking 1"),
        ("log", "warning", "something odd"),
        ("stdout", "info", "printed 1"),
        ("stderr", "warning", "to stderr"),
        ("stdout", "info", "two"),
        ("stdout", "info", "lines"),
    ]
    assert {o.address for o in heard} == {address}


def test_runtime_tail_bounds_a_chatty_agent(chatty_wasm: Path) -> None:
    """An agent printing more than the tail holds keeps only its last lines, counted."""
    with Runtime(workers=1, output_lines=10) as rt:
        rt.register(AgentType("chatty", Component.load(chatty_wasm)))
        address = rt.spawn("chatty")
        rt.ask(address, "spam", {"n": 50})
        output = rt.process(address).output
    assert [o.text for o in output.items()] == [f"line {i}" for i in range(40, 50)]
    assert output.dropped == 41  # 40 lines and "chatty is up"


def _manifest(tmp_path: Path) -> Path:
    for name in ("chatty.py", "chatty.toml"):
        shutil.copy(GUESTS / name, tmp_path / name)
    return tmp_path / "chatty.toml"


def test_mty_run_shows_agent_output(tmp_path: Path, chatty_wasm: Path) -> None:
    """mty run streams log and print lines on stderr with the address; --log-level filters."""
    manifest = _manifest(tmp_path)
    done = subprocess.run([MTY, "run", str(manifest)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    for line in (
        "[chatty:1] info: chatty is up",
        "[chatty:1] info: talking 1",
        "[chatty:1] warning: something odd",
        "[chatty:1] printed 1",
        "[chatty:1] stderr: to stderr",
        "[chatty:1] two",
        "[chatty:1] lines",
    ):
        assert line in err
    assert "[chatty:1] debug: debug detail 1" not in err
    debug = subprocess.run(
        [MTY, "run", str(manifest), "--log-level", "debug"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "[chatty:1] debug: debug detail 1" in debug.stderr.splitlines()
    warn = subprocess.run(
        [MTY, "run", str(manifest), "--log-level", "warning"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "[chatty:1] printed 1" not in warn.stderr
    assert "[chatty:1] warning: something odd" in warn.stderr.splitlines()
    quiet = subprocess.run(
        [MTY, "run", str(manifest), "--quiet"], capture_output=True, text=True, check=False
    )
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_mty_run_json_carries_output(tmp_path: Path, chatty_wasm: Path) -> None:
    """mty run --json has each agent's lines (stream, level, text) and a dropped count."""
    done = subprocess.run(
        [MTY, "run", str(_manifest(tmp_path)), "--json", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    agent = json.loads(done.stdout)["agents"][0]
    lines = [(o["stream"], o["level"], o["text"]) for o in agent["output"]]
    assert ("log", "info", "talking 1") in lines
    assert ("stdout", "info", "printed 1") in lines
    assert ("stderr", "warning", "to stderr") in lines
    assert agent["output_dropped"] == 0
