"""examples/agents/assistant: a real run against the scripted model, replay offline, eval of builds."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mighty.trace import read_instances

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agents" / "assistant"
EXAMPLE_ORIGIN = "http://127.0.0.1:18080"
QUESTION = "What is the capital of France?"


def _scripted_llm() -> ModuleType:
    # A standalone script, not a package: loaded by path under its own name, once per session.
    if "scripted_llm" in sys.modules:
        return sys.modules["scripted_llm"]
    spec = importlib.util.spec_from_file_location("scripted_llm", EXAMPLE / "scripted_llm.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scripted_llm"] = module
    spec.loader.exec_module(module)
    return module


ScriptedLLM = _scripted_llm().ScriptedLLM

# Run `mty` in a process where every connect and name lookup is refused, through audit hooks
# (they see every socket call of the interpreter and of httpcore under it, and cannot be
# removed once added).
NO_NETWORK = """
import sys

REFUSED = {
    "socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
    "socket.gethostbyaddr", "socket.getnameinfo",
}

def refuse(event, args):
    if event in REFUSED:
        raise PermissionError(f"no network in this process: {event}")

sys.addaudithook(refuse)
"""
MTY_OFFLINE = (
    NO_NETWORK + "from mighty.cli import main\nsys.argv = ['mty', *sys.argv[1:]]\nmain()\n"
)


def mty() -> list[str]:
    """The `mty` command of this environment."""
    script = Path(sys.executable).parent / "mty"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mighty.cli"]


def offline_env() -> dict[str, str]:
    """This environment without any API key."""
    return {k: v for k, v in os.environ.items() if k not in ("LLM_API_KEY", "SCRIPTED_LLM_KEY")}


def run_offline(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`mty ARGS` with no network and no key (unless ``env`` adds one)."""
    return subprocess.run(
        [sys.executable, "-c", MTY_OFFLINE, *args],
        cwd=cwd,
        env={**offline_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def manifest_for(origin: str, folder: Path) -> Path:
    """The example's manifest, written to ``folder``, with the model at ``origin``."""
    text = (EXAMPLE / "assistant.toml").read_text()
    assert text.count(EXAMPLE_ORIGIN) == 2  # the http grant and the init's base_url
    text = text.replace(EXAMPLE_ORIGIN, origin)
    for source in ("assistant.py", "facts.py"):
        text = text.replace(f'source = "{source}"', f'source = "{EXAMPLE / source}"')
    path = folder / "assistant.toml"
    path.write_text(text)
    return path


@dataclass(frozen=True)
class Recorded:
    """One recorded run of the example against the scripted model."""

    key: str
    origin: str
    requests: list[Any]
    done: subprocess.CompletedProcess[str]
    trace: Path
    folder: Path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """`mty run assistant.toml --record` against a ScriptedLLM on a loopback port; then stopped."""
    folder = tmp_path_factory.mktemp("assistant")
    key = f"sk-test-{secrets.token_hex(12)}"
    trace = folder / "run.bin"
    with ScriptedLLM(EXAMPLE / "script.json", key=key, port=0) as server:
        manifest = manifest_for(server.url, folder)
        done = subprocess.run(
            [*mty(), "run", str(manifest), "--record", str(trace), "--json"],
            env={**offline_env(), "LLM_API_KEY": key},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        origin, requests = server.url, server.requests
    return Recorded(key, origin, requests, done, trace, folder)


@pytest.mark.slow
def test_the_assistant_answers_with_the_fact_the_tool_found(recorded: Recorded) -> None:
    """The run exits 0 and the reply to the question is the model's answer with "Paris"."""
    assert recorded.done.returncode == 0, recorded.done.stderr
    report = json.loads(recorded.done.stdout)
    assert report["ok"] is True
    [reply] = report["replies"]
    assert reply["to"] == "assistant"
    assert reply["reply"] == {"question": QUESTION, "answer": "Answer: Paris"}


@pytest.mark.slow
def test_the_model_saw_two_completions_with_the_key_and_the_tool_result(
    recorded: Recorded,
) -> None:
    """Two chat completions with the host's key; the second carries the lookup's answer."""
    assert [(r.method, r.path, r.status) for r in recorded.requests] == [
        ("POST", "/v1/chat/completions", 200),
        ("POST", "/v1/chat/completions", 200),
    ]
    assert all(r.header("Authorization") == f"Bearer {recorded.key}" for r in recorded.requests)
    first, second = (r.body for r in recorded.requests)
    assert first["model"] == second["model"] == "scripted-model"
    assert [t["function"]["name"] for t in first["tools"]] == ["lookup"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == QUESTION
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    [call] = second["messages"][2]["tool_calls"]
    assert call["function"]["name"] == "lookup"
    assert json.loads(call["function"]["arguments"]) == {"topic": "capital of France"}
    assert second["messages"][3] == {"role": "tool", "tool_call_id": call["id"], "content": "Paris"}


@pytest.mark.slow
def test_the_guest_never_saw_the_key(recorded: Recorded) -> None:
    """The key is in no byte of the trace, and both agents' environments were empty."""
    assert recorded.done.returncode == 0, recorded.done.stderr
    data = recorded.trace.read_bytes()
    assert recorded.key.encode() not in data
    assert recorded.key.encode("utf-16-le") not in data
    instances, truncated = read_instances(recorded.trace)
    assert not truncated
    environments = {
        next(r["a"] for r in records if r.get("k") == "instance"): [
            r["res"] for r in records if r.get("k") == "import" and r["fn"] == "get-environment"
        ]
        for records in instances.values()
    }
    assert environments == {"facts:1": [[]], "assistant:2": [[]]}
    assert recorded.key not in recorded.done.stdout + recorded.done.stderr


def test_the_no_network_wrapper_refuses_connects_and_lookups() -> None:
    """A connect to a listening loopback socket and a name lookup both fail under the hook."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        probe = (
            NO_NETWORK
            + "import socket\n"
            + "for attempt in (\n"
            + f"    lambda: socket.socket().connect(('127.0.0.1', {port})),\n"
            + "    lambda: socket.getaddrinfo('localhost', 80),\n"
            + "    lambda: socket.gethostbyname('localhost'),\n"
            + "):\n"
            + "    try:\n"
            + "        attempt()\n"
            + "    except PermissionError as exc:\n"
            + "        print('refused', exc)\n"
            + "    else:\n"
            + "        print('reached')\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "refused no network in this process: socket.connect",
        "refused no network in this process: socket.getaddrinfo",
        "refused no network in this process: socket.gethostbyname",
    ]


@pytest.mark.slow
def test_replay_needs_no_network_and_no_key(recorded: Recorded) -> None:
    """`mty replay` of the run, with the model stopped and every connect refused: ok."""
    assert recorded.done.returncode == 0, recorded.done.stderr
    done = run_offline("replay", str(recorded.trace), cwd=recorded.folder)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("ok: digest ")
    assert [line.split(":")[0] for line in lines[:-1]] == ["instance 1", "instance 2"]
    assert all(line.endswith("import(s) replayed") for line in lines[:-1])


def suite_for(recorded: Recorded, folder: Path, members: dict[str, Path]) -> Path:
    """A suite file: the recorded run as one case (the assistant's instances), these members."""
    lines = [
        'policy = "strict"',
        "",
        "[[case]]",
        'name = "capital"',
        f'trace = "{recorded.trace}"',
        'agent = "assistant"',
    ]
    for name, source in members.items():
        lines += ["", "[[member]]", f'name = "{name}"', f'source = "{source}"']
    lines += [
        "",
        "[[compare]]",
        'name = "equal"',
        'id = "reply"',
        'on = "result"',
        "",
        "[[compare]]",
        'name = "equal"',
        'id = "sent"',
        'on = "messages"',
    ]
    path = folder / "suite.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# Not the recorded key: what eval answers from the trace must not depend on it.
STAND_IN_KEY = {"LLM_API_KEY": "sk-not-the-recorded-key"}


def eval_offline(suite: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`mty eval SUITE --json` with no network (and no key unless ``env`` has one): the report."""
    done = run_offline("eval", str(suite), "--json", "--workers", "1", cwd=suite.parent, env=env)
    assert done.returncode in (0, 1), done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def cells(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's cells by member name."""
    return {c["member"]: c for c in report["cells"]}


MEMBERS = {"assistant": EXAMPLE / "assistant.py", "refactor": EXAMPLE / "assistant_refactor.py"}


@pytest.mark.slow
def test_eval_passes_the_recorded_build_and_a_refactor_offline(
    recorded: Recorded, tmp_path: Path
) -> None:
    """The recorded build and a refactor sending the same requests pass, with no network."""
    assert recorded.done.returncode == 0, recorded.done.stderr
    report = eval_offline(suite_for(recorded, tmp_path, MEMBERS), env=STAND_IN_KEY)
    verdicts = {m: c["verdict"] for m, c in cells(report).items()}
    assert verdicts == {"assistant": "pass", "refactor": "pass"}, report["cells"]
    assert report["ok"] is True


@pytest.mark.slow
def test_eval_needs_no_key(recorded: Recorded, tmp_path: Path) -> None:
    """With no key in the environment at all, the recorded build still passes."""
    assert recorded.done.returncode == 0, recorded.done.stderr
    report = eval_offline(suite_for(recorded, tmp_path, MEMBERS))
    verdicts = {m: c["verdict"] for m, c in cells(report).items()}
    assert verdicts == {"assistant": "pass", "refactor": "pass"}, report["cells"]


def diverged_on(recorded: Recorded, cell: dict[str, Any], size: int) -> None:
    """The cell diverged on the first chat completion, a request of ``size`` body bytes."""
    assert cell["verdict"] == "diverged", cell
    request = f"POST {recorded.origin}/v1/chat/completions, a {size}-byte body"
    assert cell["reason"] == f"instance 2: the trace has no answer for HTTP {request}"


def first_body_size(recorded: Recorded, source: str) -> int:
    """The size of the first request body ``source``'s assistant sends (the recorded one's,
    with its system prompt swapped for the member's)."""
    first = recorded.requests[0].raw
    system = json.loads(first)["messages"][0]["content"]
    member = source.split('SYSTEM = "', 1)[1].split('"', 1)[0]
    return len(first) - len(system.encode()) + len(member.encode())


@pytest.mark.slow
def test_eval_a_reworded_prompt_diverges_on_its_first_request(
    recorded: Recorded, tmp_path: Path
) -> None:
    """Another system prompt is a request the trace never saw: diverged, naming that request."""
    assert recorded.done.returncode == 0, recorded.done.stderr
    source = EXAMPLE / "assistant_reworded.py"
    suite = suite_for(recorded, tmp_path, {"reworded": source})
    [cell] = eval_offline(suite, env=STAND_IN_KEY)["cells"]
    size = first_body_size(recorded, source.read_text())
    assert size != len(recorded.requests[0].raw)
    diverged_on(recorded, cell, size)


@pytest.mark.slow
def test_eval_a_same_length_prompt_diverges_on_the_request_body(
    recorded: Recorded, tmp_path: Path
) -> None:
    """A prompt of the same length, so only the body's bytes differ: diverged all the same."""
    assert recorded.done.returncode == 0, recorded.done.stderr
    source = (EXAMPLE / "assistant.py").read_text()
    assert source.count("questions briefly") == 1
    member = tmp_path / "assistant_tersely.py"
    member.write_text(source.replace("questions briefly", "questions tersely"))
    [cell] = eval_offline(suite_for(recorded, tmp_path, {"tersely": member}), env=STAND_IN_KEY)[
        "cells"
    ]
    diverged_on(recorded, cell, len(recorded.requests[0].raw))
