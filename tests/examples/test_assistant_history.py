"""examples/agents/assistant, durable: the README's "History and forks" section run as written
(the scripted model and `mty` as real processes on loopback, the runtime killed with -9 while
the model holds its second request), then what `mty history` listed, the forks, the recovery."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docs._markdown import Block, blocks, expected_output, matches

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agents" / "assistant"
README = EXAMPLE / "README.md"
SECTION = "## History and forks"
PORT = "18080"
COMPLETIONS = "/v1/chat/completions"


def section_blocks() -> list[Block]:
    """The sh blocks of the README's History and forks section, in order."""
    lines = README.read_text(encoding="utf-8").splitlines()
    heading = lines.index(SECTION) + 1
    after = [line for line in lines[heading:] if line.startswith("## ")]
    end = lines.index(after[0], heading) + 1 if after else len(lines) + 1
    return [b for b in blocks(README) if heading < b.line < end and b.lang == "sh"]


def free_port() -> str:
    """A loopback port nothing listens on now (the README's 18080 may be taken here)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def environment() -> dict[str, str]:
    """This environment with its `mty` first on PATH and no API key."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "SCRIPTED_LLM_KEY")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def bash(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` as one bash script (its jobs and ``$!`` need one shell), failing on errors."""
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", code],
        cwd=cwd,
        env=environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,  # a cold build of both agents on a loaded machine
        check=False,
    )


def commands(block: Block) -> list[str]:
    """A block's commands, one a line, comments dropped."""
    return [c for c in block.code.splitlines() if c.strip() and not c.startswith("#")]


def run_lines(block: Block, cwd: Path, port: str) -> dict[str, str]:
    """Each command of ``block`` run alone, checked against its ``# -> `` output; the outputs."""
    outputs: dict[str, str] = {}
    for command in commands(block):
        done = bash(command.replace(PORT, port), cwd)
        assert done.returncode == 0, f"{block.where}: {command}\n{done.stdout}{done.stderr}"
        expected = expected_output(command)
        if expected is not None:
            assert matches(expected.replace(PORT, port), done.stdout), (command, done.stdout)
        outputs[command.split("#")[0].strip()] = done.stdout
    return outputs


def mty_json(*args: str, cwd: Path) -> dict[str, Any]:
    """`mty ARGS --json`'s object (exit 0)."""
    done = bash(" ".join(["mty", *args, "--json"]), cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@dataclass(frozen=True)
class Durable:
    """What the README's durable flow printed and left, step by step."""

    folder: Path
    port: str
    crashed_model: list[str]
    history: dict[str, Any]
    history_text: str
    forks: dict[str, str]
    again: dict[str, Any]
    then: dict[str, Any]
    recovered: subprocess.CompletedProcess[str]
    recovered_model: list[str]
    after: dict[str, Any]


@pytest.fixture(scope="module")
def durable(tmp_path_factory: pytest.TempPathFactory) -> Durable:
    """The section's four blocks in a copy of the example folder, the model on a free port."""
    crash, history, fork, recover = section_blocks()
    folder = tmp_path_factory.mktemp("assistant-durable")
    port = free_port()
    for path in EXAMPLE.iterdir():
        if path.suffix in (".py", ".json", ".toml"):
            shutil.copy(path, folder / path.name)
    for manifest in ("durable.toml", "recover.toml"):
        text = (folder / manifest).read_text()
        assert text.count(f"127.0.0.1:{PORT}") == 2 + 2 * (manifest == "recover.toml")
        (folder / manifest).write_text(text.replace(PORT, port))
    done = bash(crash.code.replace(PORT, port), folder)
    assert done.returncode == 0, done.stdout + done.stderr
    crashed_model = (folder / "model.log").read_text().splitlines()
    history_text = run_lines(history, folder, port)["mty history assistant durable.toml"]
    found = json.loads((folder / "history.json").read_text())
    forks = run_lines(fork, folder, port)
    again = mty_json("history", "assistant-again", "durable.toml", cwd=folder)
    then = mty_json("history", "assistant-then", "durable.toml", cwd=folder)
    recovered = bash(recover.code.replace(PORT, port), folder)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    for command in commands(recover):
        expected = expected_output(command)
        if expected is not None and command.startswith("LLM_API_KEY"):
            assert matches(expected, recovered.stdout), recovered.stdout
    recovered_model = (folder / "model.log").read_text().splitlines()
    after = mty_json("history", "assistant", "durable.toml", cwd=folder)
    return Durable(
        folder,
        port,
        crashed_model,
        found,
        history_text,
        forks,
        again,
        then,
        recovered,
        recovered_model,
        after,
    )


def requests(model_log: list[str]) -> list[tuple[str, str, str]]:
    """(status, turn, idempotency key) of each request line of a `--log-requests` log."""
    found = []
    for line in model_log:
        if line.startswith(f"POST {COMPLETIONS} -> "):
            status, turn, key = line.split(" -> ", 1)[1].split(", ")
            found.append((status, turn, key.removeprefix("Idempotency-Key ")))
    return found


def test_the_readme_section_has_its_four_blocks() -> None:
    """Crash, history, forks, recovery: the blocks the fixture runs, with the README's port."""
    found = section_blocks()
    assert len(found) == 4
    assert all(PORT in b.code for b in (found[0], found[3]))
    assert "kill -9" in found[0].code
    assert "mty history assistant durable.toml" in found[1].code
    assert "mty fork assistant --at 4" in found[2].code
    assert "mty run recover.toml" in found[3].code


@pytest.mark.slow
def test_the_model_held_the_second_request_when_the_runtime_was_killed(durable: Durable) -> None:
    """The model answered turn 1 and held turn 2, each with a durable agent's idempotency key."""
    assert [(s, t) for s, t, _ in requests(durable.crashed_model)] == [
        ("200", "turn 1"),
        ("held", "turn 2"),
    ]
    assert all(len(k) == 32 for _s, _t, k in requests(durable.crashed_model))
    assert durable.crashed_model[-1] == "holding request 2"


@pytest.mark.slow
def test_history_lists_the_question_the_model_requests_and_the_ask_in_order(
    durable: Durable,
) -> None:
    """Checkpoint, the question in flight, the first request (200), the log line, the ask to
    facts, the second request with no response: HTTP requests are one import entry each."""
    entries = durable.history["entries"]
    assert durable.history["agent"] == "assistant:2"
    assert [e["kind"] for e in entries] == ["checkpoint", "message"] + ["import"] * 4
    assert [e["position"] for e in entries] == list(range(6))
    assert entries[1]["message"] == "question" and entries[1]["in_flight"] is True
    url = f"http://127.0.0.1:{durable.port}{COMPLETIONS}"
    first, line, ask, second = entries[2:]
    assert [e.get("http", {}).get("url") for e in entries[2:]] == [url, None, None, url]
    assert (first["http"]["method"], first["http"]["status"]) == ("POST", 200)
    assert first["http"]["response_bytes"] > 0 and first["imports"] > 10
    assert (second["http"]["method"], second["http"]["status"]) == ("POST", None)
    assert second["http"]["request_bytes"] > first["http"]["request_bytes"]  # + the tool's turn
    assert "no response logged" in second["summary"]
    assert (line["function"], ask["function"]) == ("log", "ask")
    assert "'facts' lookup {'topic': 'capital of France'}" in ask["summary"]
    # The log's imports, numbered across the entries without a gap.
    assert first["first_import"] == 1
    assert [line["import"], ask["import"]] == [first["import"] + 1, first["import"] + 2]
    assert second["first_import"] == ask["import"] + 1
    assert second["import"] == second["first_import"] + second["imports"] - 1
    text = durable.history_text.splitlines()
    assert [row.split()[1] for row in text[1:]] == [e["kind"] for e in entries]
    assert f"http POST {url}, " in text[3] and "-> 200, " in text[3]


@pytest.mark.slow
def test_forks_hold_the_state_of_their_position_in_their_own_log(durable: Durable) -> None:
    """assistant-then is the checkpoint alone; assistant-again the entries up to the ask, in a
    log of its own."""
    assert [e["kind"] for e in durable.then["entries"]] == ["checkpoint"]
    assert durable.then["log"] is None
    original = durable.history["entries"]
    forked = durable.again["entries"]
    assert durable.again["agent"] == "assistant:4"
    assert [(e["kind"], e["summary"]) for e in forked] == [
        (e["kind"], e["summary"]) for e in original[:5]
    ]
    assert durable.again["log"] != durable.history["log"]
    assert Path(durable.again["log"]).name == "assistant_4.trace"
    assert forked[0]["component"] == original[0]["component"]


@pytest.mark.slow
def test_recovery_finishes_the_question_and_runs_the_fork_from_its_log(durable: Durable) -> None:
    """After the restart: the assistant and the fork answered once each, the checkpoint fork
    none; the model saw only the second turn, twice: the held request again with its key, and
    the fork's with another; nothing is left in flight."""
    replies = [line for line in durable.recovered.stdout.splitlines() if " <- status: " in line]
    assert replies == [
        'assistant <- status: {"answered": 1}',
        'assistant-then <- status: {"answered": 0}',
        'assistant-again <- status: {"answered": 1}',
    ]
    seen = requests(durable.recovered_model)
    assert [(s, t) for s, t, _ in seen] == [("200", "turn 2"), ("200", "turn 2")]
    held_key = requests(durable.crashed_model)[1][2]
    keys = [k for _s, _t, k in seen]
    assert keys.count(held_key) == 1
    assert len(set(keys)) == 2
    assert [e["kind"] for e in durable.after["entries"]] == ["checkpoint"]
    assert durable.after["log"] is None
