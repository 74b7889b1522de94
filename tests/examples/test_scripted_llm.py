"""examples/agents/assistant/scripted_llm.py: the scripted OpenAI-compatible server, under httpx."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agents" / "assistant"
KEY = "sk-test"
TIMEOUT = httpx.Timeout(5.0)


def _load() -> ModuleType:
    # The example is a standalone script, not a package: load it by path under its own name,
    # as `from scripted_llm import ScriptedLLM` would next to it.
    spec = importlib.util.spec_from_file_location("scripted_llm", EXAMPLE / "scripted_llm.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("scripted_llm", module)
    spec.loader.exec_module(module)
    return module


scripted_llm = _load()
ScriptedLLM = scripted_llm.ScriptedLLM

QUESTION = [
    {"role": "system", "content": "You answer with the lookup tool."},
    {"role": "user", "content": "What is the capital of France?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a topic up.",
            "parameters": {"type": "object", "properties": {"topic": {"type": "string"}}},
        },
    }
]


def _after_tool(result: Any) -> list[dict[str, Any]]:
    """The conversation after the model's lookup call and the tool's answer."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"topic": "capital of France"}'},
    }
    return [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": result},
    ]


@pytest.fixture
def llm() -> Iterator[Any]:
    """The server with the example's default script and the key sk-test."""
    with ScriptedLLM(key=KEY) as server:
        yield server


@pytest.fixture
def client(llm: Any) -> Iterator[httpx.Client]:
    """An httpx client for the server, carrying the right key."""
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=llm.base_url, headers=headers, timeout=TIMEOUT) as c:
        yield c


def _chat(client: httpx.Client, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {"model": "gpt-test", "messages": messages, "tools": TOOLS, **extra}
    return client.post("/chat/completions", json=body)


def test_the_key_is_required(llm: Any) -> None:
    """No key or a wrong key is a 401 with an OpenAI-style error; the right key is a 200."""
    body = {"model": "m", "messages": QUESTION}
    with httpx.Client(timeout=TIMEOUT) as plain:
        url = f"{llm.base_url}/chat/completions"
        missing = plain.post(url, json=body)
        wrong = plain.post(url, json=body, headers={"Authorization": "Bearer sk-wrong"})
        basic = plain.post(url, json=body, headers={"Authorization": f"Basic {KEY}"})
        right = plain.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"})
        models = plain.get(f"{llm.base_url}/models")
    for refused in (missing, wrong, basic, models):
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
    assert right.status_code == 200


def test_the_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without key=, the key is $SCRIPTED_LLM_KEY; with neither, construction fails."""
    monkeypatch.setenv(scripted_llm.KEY_ENV, "sk-env")
    with ScriptedLLM() as server, httpx.Client(timeout=TIMEOUT) as plain:
        headers = {"Authorization": "Bearer sk-env"}
        assert plain.get(f"{server.base_url}/models", headers=headers).status_code == 200
    monkeypatch.delenv(scripted_llm.KEY_ENV)
    with pytest.raises(ValueError, match="API key is required"):
        ScriptedLLM()


def test_models_lists_the_model(client: httpx.Client) -> None:
    """GET /v1/models lists the one model."""
    response = client.get("/models")
    assert response.status_code == 200
    assert [m["id"] for m in response.json()["data"]] == ["scripted-model"]


def test_first_turn_is_the_tool_call(client: httpx.Client) -> None:
    """A conversation with no assistant message gets the script's first turn: a lookup call."""
    response = _chat(client, QUESTION)
    assert response.status_code == 200
    completion = response.json()
    assert completion["id"] == "chatcmpl-0"
    assert completion["object"] == "chat.completion"
    assert completion["created"] == scripted_llm.CREATED
    assert completion["model"] == "gpt-test"
    (choice,) = completion["choices"]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant"
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["id"] == "call_0"
    assert call["type"] == "function"
    assert call["function"]["name"] == "lookup"
    assert isinstance(call["function"]["arguments"], str)
    assert json.loads(call["function"]["arguments"]) == {"topic": "capital of France"}
    usage = completion["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] > 0


def test_second_turn_fills_the_tool_result(client: httpx.Client) -> None:
    """After one assistant message, the final answer comes, with the last tool result filled in."""
    completion = _chat(client, _after_tool("Paris")).json()
    assert completion["id"] == "chatcmpl-1"
    (choice,) = completion["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {"role": "assistant", "content": "Answer: Paris"}


def test_tool_result_as_content_parts(client: httpx.Client) -> None:
    """A tool message whose content is a list of text parts fills the placeholder with the text."""
    parts = [{"type": "text", "text": "Par"}, {"type": "text", "text": "is"}]
    completion = _chat(client, _after_tool(parts)).json()
    assert completion["choices"][0]["message"]["content"] == "Answer: Paris"


def test_turn_depends_on_the_conversation_not_the_request_order(client: httpx.Client) -> None:
    """The turn is the count of assistant messages: order and repeats change nothing."""
    later = _chat(client, _after_tool("Paris")).json()
    first = _chat(client, QUESTION).json()
    assert _chat(client, QUESTION).json() == first
    assert _chat(client, _after_tool("Paris")).json() == later
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    assert later["choices"][0]["message"]["content"] == "Answer: Paris"


def test_a_conversation_past_the_script_is_refused(client: httpx.Client) -> None:
    """More assistant messages than the script has turns is a 400 that says so."""
    messages = [*_after_tool("Paris"), {"role": "assistant", "content": "Answer: Paris"}]
    response = _chat(client, messages)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "script_exhausted"


def test_script_as_a_list_with_several_calls() -> None:
    """A script given as a list: call ids count across turns; string arguments pass as they are."""
    turns = [
        {"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b"}]},
        {"tool_calls": [{"name": "c", "arguments": '{"raw": true}'}]},
        {"content": "no tool said: {last_tool_result}."},
    ]
    with (
        ScriptedLLM(turns, key=KEY) as server,
        httpx.Client(
            base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT
        ) as c,
    ):
        first = _chat(c, QUESTION).json()["choices"][0]["message"]["tool_calls"]
        assert [(t["id"], t["function"]["name"]) for t in first] == [
            ("call_0", "a"),
            ("call_1", "b"),
        ]
        assert [t["function"]["arguments"] for t in first] == ['{"x": 1}', "{}"]
        asked = [*QUESTION, {"role": "assistant", "content": "thinking"}]
        (second,) = _chat(c, asked).json()["choices"][0]["message"]["tool_calls"]
        assert (second["id"], second["function"]["arguments"]) == ("call_2", '{"raw": true}')
        asked.append({"role": "assistant", "content": "still thinking"})
        final = _chat(c, asked).json()["choices"][0]["message"]["content"]
        assert final == "no tool said: ."


@pytest.mark.parametrize(
    ("turns", "match"),
    [
        ([], "non-empty"),
        ([{"text": "hi"}], "neither"),
        ([{"content": 3}], "'content' must be"),
        ([{"content": "x", "extra": 1}], "unknown keys"),
        ([{"tool_calls": []}], "non-empty list"),
        ([{"tool_calls": [{"arguments": {}}]}], "needs a 'name'"),
        ([{"tool_calls": [{"name": "a", "arguments": 3}]}], "arguments are"),
    ],
)
def test_bad_scripts_are_refused(turns: list[Any], match: str) -> None:
    """A script with a malformed turn is refused when loaded, naming the problem."""
    with pytest.raises(ValueError, match=match):
        scripted_llm.load_script(turns)


def test_the_default_script_file() -> None:
    """script.json is the two-turn conversation: a lookup call, then a templated answer."""
    turns = scripted_llm.load_script(EXAMPLE / "script.json")
    assert turns == [
        {"tool_calls": [{"name": "lookup", "arguments": {"topic": "capital of France"}}]},
        {"content": "Answer: {last_tool_result}"},
    ]


def test_malformed_json_is_a_400(client: httpx.Client) -> None:
    """A body that is not JSON, or not a chat request, is a 400."""
    bad = client.post(
        "/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert bad.status_code == 400
    assert "malformed JSON" in bad.json()["error"]["message"]
    assert client.post("/chat/completions", content=b"").status_code == 400
    assert client.post("/chat/completions", json=[1, 2]).status_code == 400
    assert client.post("/chat/completions", json={"model": "m"}).status_code == 400
    assert client.post("/chat/completions", json={"messages": QUESTION}).status_code == 400
    assert _chat(client, QUESTION, stream=True).status_code == 400


def test_unknown_paths_and_methods(client: httpx.Client) -> None:
    """Unknown paths are 404; the wrong method on a known path is 405."""
    assert client.get("/embeddings").status_code == 404
    assert client.get("/chat/completions").status_code == 405
    assert client.post("/models", json={}).status_code == 405


def test_a_chunked_request_body(client: httpx.Client) -> None:
    """A request body sent chunked (as a streaming guest might) is read whole."""
    data = json.dumps({"model": "m", "messages": QUESTION}).encode()

    def parts() -> Iterator[bytes]:
        yield data[:10]
        yield data[10:]

    response = client.post("/chat/completions", content=parts())
    assert response.status_code == 200
    assert response.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_every_request_is_recorded(llm: Any, client: httpx.Client) -> None:
    """Each request, refused or answered, is recorded with method, path, headers, parsed body."""
    _chat(client, QUESTION)
    client.post("/chat/completions", content=b"{oops")
    httpx.post(f"{llm.base_url}/chat/completions", json={"model": "x"}, timeout=TIMEOUT)
    answered, malformed, refused = llm.requests
    assert (answered.method, answered.path, answered.status) == (
        "POST",
        "/v1/chat/completions",
        200,
    )
    assert answered.header("authorization") == f"Bearer {KEY}"
    assert answered.body["messages"] == QUESTION
    assert answered.body["tools"] == TOOLS
    assert (malformed.status, malformed.body, malformed.raw) == (400, None, b"{oops")
    assert (refused.status, refused.body) == (401, {"model": "x"})


def test_runs_as_a_script(tmp_path: Path) -> None:
    """As a script it prints its URL first, serves the script file given, and exits on SIGTERM."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "only turn"}]))
    command = [
        sys.executable,
        str(EXAMPLE / "scripted_llm.py"),
        *("--script", str(script), "--key", KEY, "--port", "0"),
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            with ThreadPoolExecutor(1) as pool:
                line = pool.submit(proc.stdout.readline).result(timeout=30)
            assert line.startswith("listening on http://127.0.0.1:")
            url = line.removeprefix("listening on ").strip()
            response = httpx.post(
                f"{url}/v1/chat/completions",
                json={"model": "m", "messages": QUESTION},
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=TIMEOUT,
            )
            assert response.json()["choices"][0]["message"]["content"] == "only turn"
        finally:
            proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_close_hangs_up_keep_alive_connections() -> None:
    """close() returns with a client's idle keep-alive connection still open."""
    server = ScriptedLLM(key=KEY).start()
    with httpx.Client(timeout=TIMEOUT, headers={"Authorization": f"Bearer {KEY}"}) as c:
        assert c.get(f"{server.base_url}/models").status_code == 200
        server.close()
        server.close()
        with pytest.raises(RuntimeError, match="not running"):
            _ = server.url


def test_hold_never_answers_the_nth_completion() -> None:
    """hold=2: the first completion is answered, the second is recorded (status 0) and held
    until the server stops, which hangs up on it; on_request sees both."""
    seen: list[Any] = []
    server = ScriptedLLM(key=KEY, hold=2, on_request=seen.append).start()
    headers = {"Authorization": f"Bearer {KEY}"}
    try:
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=60.0) as c:
            assert _chat(c, QUESTION).status_code == 200
            with ThreadPoolExecutor(1) as pool:
                held = pool.submit(_chat, c, _after_tool("Paris"))
                assert server.holding.wait(60)
                assert not held.done()
                server.close()
                with pytest.raises(httpx.TransportError):
                    held.result(60)
    finally:
        server.close()
    assert [r.status for r in server.requests] == [200, 0]
    assert server.requests[1].body["messages"] == _after_tool("Paris")
    assert seen == server.requests


def test_log_requests_prints_a_line_per_request(capsys: pytest.CaptureFixture[str]) -> None:
    """--log-requests' line: method, path, status (or held), the turn, the idempotency key."""
    printed = scripted_llm._print_request
    body = {"model": "m", "messages": _after_tool("Paris")}
    raw = json.dumps(body).encode()
    headers = [("Idempotency-Key", "k1")]
    printed(scripted_llm.RecordedRequest("POST", "/v1/chat/completions", headers, body, raw, 0))
    printed(scripted_llm.RecordedRequest("GET", "/v1/models", [], None, b"", 200))
    assert capsys.readouterr().out.splitlines() == [
        "POST /v1/chat/completions -> held, turn 2, Idempotency-Key k1",
        "GET /v1/models -> 200, Idempotency-Key -",
    ]


class _Switching:
    """A stdout that lets another thread run inside every write (as a pipe's may)."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        time.sleep(0)
        self.writes.append(text)
        time.sleep(0)
        return len(text)

    def flush(self) -> None:
        time.sleep(0)


def test_log_lines_from_many_threads_stay_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests logged at once from the server's threads: each line whole, none run together."""
    out = _Switching()
    monkeypatch.setattr(sys, "stdout", out)
    body = {"model": "m", "messages": _after_tool("Paris")}
    raw = json.dumps(body).encode()

    def log(n: int) -> None:
        for _ in range(20):
            headers = [("Idempotency-Key", f"k{n}")]
            request = scripted_llm.RecordedRequest(
                "POST", "/v1/chat/completions", headers, body, raw, 200
            )
            scripted_llm._print_request(request)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(log, range(8)))
    lines = "".join(out.writes).splitlines()
    assert len(lines) == 160
    assert all(
        line.startswith("POST /v1/chat/completions -> 200, turn 2, Idempotency-Key k")
        and line.count("POST") == 1
        for line in lines
    )
