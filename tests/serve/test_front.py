"""Agents behind HTTP routes (`[http]` in mighty.toml): a real server on loopback asking a real
agent; each agent error answered with its status; the manifest's routes checked when loaded."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mighty._errors import BadInput
from mighty.agents import Application, load_manifest
from mighty.serve import AgentFront
from tests.serve import gate_tool

ROUTES = """
[http]
listen = "127.0.0.1:0"
max_concurrent = {max_concurrent}
{limits}
routes = [
  {{ route = "POST /kv/{{key}}", to = "front", message = "put", body = {{ key = "{{key}}", value = "$body.value" }} }},
  {{ route = "GET /kv/{{key}}", to = "front", message = "get" }},
  {{ route = "POST /echo/{{id:int}}", to = "front", message = "echo" }},
  {{ route = "POST /echo", to = "front", message = "echo" }},
  {{ route = "POST /fail", to = "front", message = "fail" }},
  {{ route = "POST /crash", to = "front", message = "crash" }},
  {{ route = "POST /quiet", to = "front", message = "quiet" }},
  {{ route = "POST /hold/{{name}}", to = "front", message = "hold" }},
  {{ route = "POST /slow/{{name}}", to = "front", message = "hold", timeout = 1.0 }},
  {{ route = "POST /narrow/{{name}}", to = "narrow", message = "hold" }},
  {{ route = "POST /once/{{what}}", to = "once", message = "crash" }},
  {{ route = "POST /once-echo", to = "once", message = "echo" }},
  {{ route = "POST /agents/{{agent}}/echo", to = "{{agent}}", message = "echo", type = "front" }},
  {{ route = "POST /agents/{{agent}}/zap", to = "{{agent}}", message = "zap" }},
]
"""

AGENTS = """
[capabilities.gate]
tool = "tests.serve.gate_tool:gate"
timeout = 300

[agents.front]
component = "{wasm}"
accepts = ["put", "get", "echo", "fail", "crash", "hold", "quiet"]
capabilities = ["gate"]

[agents.narrow]
component = "{wasm}"
capabilities = ["gate"]
mailbox = {{ capacity = 1, on_full = "fail" }}

[supervisor]
intensity = 100
children = [
  {{ name = "front", type = "front" }},
  {{ name = "narrow", type = "narrow" }},
  {{ name = "once", type = "front", restart = "temporary" }},
]
"""


def manifest_text(
    wasm: Path, *, max_concurrent: int = 32, limits: str = "", routes: str | None = None
) -> str:
    """The test system: the front agent behind the routes above (or ``routes``); ``limits``:
    more keys of [http]."""
    http = routes or ROUTES.format(max_concurrent=max_concurrent, limits=limits)
    return AGENTS.format(wasm=wasm) + http


@pytest.fixture(autouse=True)
def _gates() -> Iterator[None]:
    gate_tool.reset()
    yield
    gate_tool.reset()


Serve = Callable[..., tuple[Application, AgentFront, httpx.Client]]


@pytest.fixture
def serve(front_agent_wasm: Path, tmp_path: Path) -> Iterator[Serve]:
    """Start the test system and its HTTP front: (app, front, client)."""
    opened: list[tuple[Application, httpx.Client]] = []

    def start(**options: Any) -> tuple[Application, AgentFront, httpx.Client]:
        telemetry = options.pop("telemetry", None)
        path = tmp_path / "mighty.toml"
        path.write_text(manifest_text(front_agent_wasm, **options))
        app = Application.from_manifest(path, telemetry=telemetry)
        app.start()
        front = app.serve_http()
        assert front.address is not None
        client = httpx.Client(base_url=f"http://127.0.0.1:{front.address[1]}", timeout=120.0)
        opened.append((app, client))
        return app, front, client

    yield start
    for app, client in opened:
        client.close()
        app.shutdown()


def test_a_route_asks_the_agent_and_answers_its_reply(serve: Serve) -> None:
    """POST /kv/{key} puts with the key from the path and the value from the body; GET reads."""
    _, _, client = serve()
    put = client.post("/kv/answer", json={"value": 42})
    assert put.status_code == 200
    assert put.headers["content-type"] == "application/json"
    assert put.json() == {"ok": True, "key": "answer"}
    got = client.get("/kv/answer?ignored=1")
    assert got.json() == {"key": "answer", "value": 42}
    assert client.get("/kv/a%2Fb").json() == {"key": "a/b", "value": None}


def test_the_default_body_merges_path_parameters_into_the_json_object(serve: Serve) -> None:
    """No body template: path parameters join the object body; without a body, alone."""
    _, _, client = serve()
    assert client.post("/echo/7", json={"x": [1, 2]}).json() == {"got": {"x": [1, 2], "id": 7}}
    assert client.post("/echo/-3").json() == {"got": {"id": -3}}
    assert client.post("/echo", json=[1, "two"]).json() == {"got": [1, "two"]}
    assert client.post("/echo").json() == {"got": None}
    assert client.post("/quiet").json() is None


def test_bad_requests_are_400_404_405(serve: Serve) -> None:
    """Bad JSON, a parameter repeated in the body, no route, a method the path lacks."""
    _, front, client = serve()
    bad = client.post("/echo", content=b"{not json")
    assert (bad.status_code, bad.json()) == (400, {"error": "bad_json"})
    clash = client.post("/echo/1", json={"id": 2})
    assert clash.status_code == 400 and clash.json()["error"] == "bad_body"
    assert client.post("/echo/1", json=[1]).json()["error"] == "bad_body"
    missing = client.get("/nothing/here")
    assert (missing.status_code, missing.json()) == (404, {"error": "no_route"})
    assert client.post("/echo/x").status_code == 404  # {id:int} takes no "x"
    wrong = client.delete("/kv/a")
    assert (wrong.status_code, wrong.json()) == (405, {"error": "method_not_allowed"})
    assert wrong.headers["allow"] == "GET, POST"
    snapshot = front.snapshot()
    assert snapshot["routes"]["POST /echo"]["statuses"] == {"400": 1}


def test_agent_errors_map_to_statuses_with_their_kind(serve: Serve) -> None:
    """refused 400, noproc 404 (named by the client), a handler's error 500 with its text,
    a crash 500 without one, noproc 503 once a temporary agent is gone."""
    _, _, client = serve()
    refused = client.post("/agents/front/zap")
    assert (refused.status_code, refused.json()["error"]) == (400, "refused")
    nobody = client.post("/agents/nobody/echo", json={})
    assert (nobody.status_code, nobody.json()) == (404, {"error": "noproc"})
    assert client.post("/agents/front/echo", json={"a": 1}).json() == {
        "got": {"a": 1, "agent": "front"}
    }
    failed = client.post("/fail")
    assert failed.status_code == 500
    assert failed.json()["error"] == "failed"
    assert "no such order" in failed.json()["message"]
    crashed = client.post("/crash")
    assert (crashed.status_code, crashed.json()) == (500, {"error": "failed"})
    assert client.post("/echo", json=1).json() == {"got": 1}  # restarted by its supervisor
    assert client.post("/once/now").json() == {"error": "failed"}
    gone = client.post("/once-echo")
    assert (gone.status_code, gone.json()) == (503, {"error": "noproc"})


def _post_in_background(client: httpx.Client, path: str) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def post() -> None:
        out.append(client.post(path))

    thread = threading.Thread(target=post)
    thread.start()
    return thread, out


def test_a_full_mailbox_is_429(serve: Serve, front_agent_wasm: Path) -> None:
    """One message held in the handler, one queued (capacity 1, on_full fail): the next is 429."""
    app, _, _ = serve()
    front = app.http
    assert front is not None and front.address is not None
    url = f"http://127.0.0.1:{front.address[1]}"
    with (
        httpx.Client(base_url=url, timeout=120.0) as a,
        httpx.Client(base_url=url, timeout=120.0) as b,
    ):
        first, first_out = _post_in_background(a, "/narrow/n")
        assert gate_tool.entered("n").wait(120)
        second, second_out = _post_in_background(b, "/narrow/n")
        for _ in range(2400):  # until the second is in the mailbox (bounded: 120 s)
            if app.runtime.inspect("narrow")["mailbox"]["depth"] == 1:
                break
            threading.Event().wait(0.05)
        else:
            raise AssertionError("the second message never reached the mailbox")
        with httpx.Client(base_url=url, timeout=120.0) as c:
            full = c.post("/narrow/n")
        assert (full.status_code, full.json()) == (429, {"error": "mailbox_full"})
        gate_tool.release("n")
        first.join(120)
        second.join(120)
    assert first_out[0].json() == {"held": "n", "released": True}
    assert second_out[0].json() == {"held": "n", "released": True}


def test_an_ask_past_its_timeout_is_504(serve: Serve) -> None:
    """The handler waits until released; the route's 1 s timeout answers 504 first."""
    _, _, client = serve()
    slow = client.post("/slow/s")
    assert (slow.status_code, slow.json()) == (504, {"error": "timeout"})
    assert gate_tool.entered("s").wait(120)  # the handler got there (however slowly)
    gate_tool.release("s")


def test_requests_past_max_concurrent_are_503_at_once(serve: Serve) -> None:
    """With max_concurrent 1 and one request held, the next is answered 503 busy."""
    _, front, client = serve(max_concurrent=1)
    with httpx.Client(base_url=str(client.base_url), timeout=120.0) as other:
        thread, out = _post_in_background(other, "/hold/h")
        assert gate_tool.entered("h").wait(120)
        busy = client.post("/echo", json=1)
        assert (busy.status_code, busy.json()) == (503, {"error": "busy"})
        snapshot = front.snapshot()
        assert snapshot["in_flight"] == 1
        assert snapshot["routes"]["POST /hold/{name}"]["in_flight"] == 1
        gate_tool.release("h")
        thread.join(120)
    assert out[0].status_code == 200
    assert front.snapshot()["routes"]["POST /hold/{name}"] == {
        "requests": 1,
        "in_flight": 0,
        "statuses": {"200": 1},
    }


# -- the manifest -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "says"),
    [
        ('{ route = "POST /x", to = "ghost", message = "put" }', "no agent of the supervision"),
        ('{ route = "POST /x", to = "front", message = "putt" }', "unknown message 'putt'"),
        ('{ route = "POST /x/{a}", to = "{a}", message = "put", type = "nope" }', "unknown agent type"),
        ('{ route = "POST /x/{a}", to = "{b}", message = "put" }', "names no parameter"),
        ('{ route = "POST /x/{a}", to = "front", message = "put", body = "{b}" }', "no parameter of the path"),
        ('{ route = "POST x", to = "front", message = "put" }', "must start with '/'"),
        ('{ route = "FETCH /x", to = "front", message = "put" }', "the method must be one of"),
        ('{ route = "POST /x/a{b}", to = "front", message = "put" }', "a parameter is a whole segment"),
        ('{ route = "POST /x//y", to = "front", message = "put" }', "empty segment"),
        ('{ route = "POST /x/{a:float}", to = "front", message = "put" }', "the kind is int or str"),
        ('{ route = "POST /x", to = "front", message = "put", timeout = 0 }', "greater than 0"),
        ('{ route = "POST /x", to = "front" }', "message"),
    ],
)  # fmt: skip
def test_bad_routes_are_refused_when_the_manifest_loads(
    route: str, says: str, tmp_path: Path
) -> None:
    """Unknown agent, type or message, a template that does not parse: BadInput naming it."""
    path = tmp_path / "mighty.toml"
    path.write_text(manifest_text(tmp_path / "x.wasm", routes=f"[http]\nroutes = [ {route} ]\n"))
    with pytest.raises(BadInput, match="http") as caught:
        load_manifest(path)
    assert says in str(caught.value)


def test_a_duplicate_route_is_refused(tmp_path: Path) -> None:
    """The same method and shape twice (parameter names aside) is refused, naming both."""
    routes = (
        "[http]\nroutes = [\n"
        '  { route = "GET /kv/{key}", to = "front", message = "get" },\n'
        '  { route = "GET /kv/{name}", to = "front", message = "get" },\n]\n'
    )
    path = tmp_path / "mighty.toml"
    path.write_text(manifest_text(tmp_path / "x.wasm", routes=routes))
    with pytest.raises(BadInput, match=r"GET /kv/\{name\} duplicates GET /kv/\{key\}"):
        load_manifest(path)


def test_the_front_reports_json_for_every_status(serve: Serve) -> None:
    """Every answer of the front is a JSON document with a content-length."""
    _, _, client = serve()
    for response in (client.post("/echo", json=1), client.get("/none"), client.post("/fail")):
        assert response.headers["content-length"] == str(len(response.content))
        json.loads(response.content)


def test_head_is_405_with_no_body_and_a_reply_past_the_limit_is_500(serve: Serve) -> None:
    """HEAD (never routed) answers 405's head alone, and the connection goes on; a reply
    bigger than max_response_bytes is 500 too_large, not sent."""
    _, _, client = serve(limits="max_response_bytes = 1000")
    head = client.head("/kv/a")
    assert (head.status_code, head.content, head.headers["allow"]) == (405, b"", "GET, POST")
    assert client.post("/echo", json="x" * 100).status_code == 200
    big = client.post("/echo", json="x" * 2000)
    assert (big.status_code, big.json()) == (500, {"error": "too_large"})


def test_a_token_file_makes_every_request_carry_the_token(serve: Serve, tmp_path: Path) -> None:
    """[http] token_file (relative to the manifest): 401 without the bearer token, the route
    with it; off loopback without one, serve_http refuses to start."""
    (tmp_path / "token").write_text("s3cret-token-of-16+\n")
    _, _, client = serve(limits='token_file = "token"')
    denied = client.post("/echo", json=1)
    assert (denied.status_code, denied.json()) == (401, {"error": "unauthorized"})
    auth = {"authorization": "Bearer s3cret-token-of-16+"}
    assert client.post("/echo", json=1, headers=auth).json() == {"got": 1}


def test_off_loopback_needs_a_token(front_agent_wasm: Path, tmp_path: Path) -> None:
    """A listen address off loopback with no token_file is refused before anything listens."""
    path = tmp_path / "mighty.toml"
    path.write_text(manifest_text(front_agent_wasm))
    with Application.from_manifest(path, telemetry=None) as app:
        app.start()
        with pytest.raises(BadInput, match="off loopback: set \\[http\\] token_file"):
            app.serve_http("0.0.0.0:0")


def test_shutdown_lets_a_request_in_flight_finish(front_agent_wasm: Path, tmp_path: Path) -> None:
    """The application's shutdown stops the front first: a request held in its handler
    still gets its answer once released, and then nothing listens."""
    import socket

    path = tmp_path / "mighty.toml"
    path.write_text(manifest_text(front_agent_wasm))
    app = Application.from_manifest(path, telemetry=None)
    try:
        app.start()
        front = app.serve_http("127.0.0.1:0")
        assert front.address is not None
        url = f"http://127.0.0.1:{front.address[1]}"
        with httpx.Client(base_url=url, timeout=120.0) as client:
            held, out = _post_in_background(client, "/hold/bye")
            assert gate_tool.entered("bye").wait(120)
            stopping = threading.Thread(target=app.shutdown)
            stopping.start()
            for _ in range(2400):  # until the shutdown has begun (bounded: 120 s)
                if front.closing:
                    break
                threading.Event().wait(0.05)
            else:
                raise AssertionError("the front never began to shut down")
            gate_tool.release("bye")
            held.join(120)
            stopping.join(120)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(front.address, timeout=60.0)
        assert out[0].status_code == 200
        assert out[0].json() == {"held": "bye", "released": True}
    finally:
        app.shutdown()
