"""A scripted, OpenAI-compatible chat-completions server on loopback, for the assistant example.

It plays a model from a script instead of thinking: a JSON list of turns, each a final answer
``{"content": "..."}`` or a tool call ``{"tool_calls": [{"name": ..., "arguments": {...}}]}``.
The turn answered is the number of assistant messages already in the request, so the answer
depends only on the conversation sent, never on how many requests came before: a replay, a
retry or another build of the agent gets the same answer for the same conversation. A content
may say ``{last_tool_result}``, filled with the content of the last ``tool`` message.

Run it: ``python scripted_llm.py --script script.json --key sk-test --port 0``; the first line
printed is ``listening on http://127.0.0.1:PORT``. Or import it: ``ScriptedLLM(turns, key=...)``
as a context manager. Standard library only, so the example needs nothing installed.

``--hold N`` (``hold=N``) makes the N-th chat completion a model that never answers: the request
is read and recorded (status 0), ``holding request N`` is printed, and the connection stays open
until the server stops. That is the moment to kill a durable agent's runtime in the middle of a
message (README.md, History and forks). ``--log-requests`` prints a line per request as it
comes, ``POST /v1/chat/completions -> 200, turn 1, Idempotency-Key 3f2a...`` (``held`` for the
held one; the key is the header a durable agent's requests carry, ``-`` without one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

__all__ = ["KEY_ENV", "PLACEHOLDER", "RecordedRequest", "ScriptedLLM", "load_script"]

KEY_ENV = "SCRIPTED_LLM_KEY"
"""The environment variable holding the API key, when none is passed."""

PLACEHOLDER = "{last_tool_result}"
"""Replaced in a turn's content by the content of the request's last tool message."""

CREATED = 1_700_000_000
"""The fixed ``created`` timestamp of every completion: answers are byte-for-byte repeatable."""

DEFAULT_SCRIPT = Path(__file__).with_name("script.json")


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server got: method, path, headers as sent, and the parsed JSON body."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: Any
    """The parsed JSON body; None when there was no body or it was not JSON."""
    raw: bytes
    status: int
    """The status the server answered with (0: held, never answered; see ``hold``)."""

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        lowered = name.lower()
        return next((v for n, v in self.headers if n.lower() == lowered), None)


def load_script(
    script: str | os.PathLike[str] | Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The turns of a script given as a JSON file's path or as a list, checked."""
    if isinstance(script, str | os.PathLike):
        turns = json.loads(Path(script).read_text(encoding="utf-8"))
    else:
        turns = [dict(turn) for turn in script]
    if not isinstance(turns, list) or not turns:
        raise ValueError("a script is a non-empty JSON list of turns")
    for i, turn in enumerate(turns):
        if problem := _problem(turn):
            raise ValueError(f"turn {i} of the script: {problem}")
    return turns


def _problem(turn: Any) -> str | None:
    """What is wrong with one turn of a script, or None."""
    if not isinstance(turn, dict) or not ({"content", "tool_calls"} & turn.keys()):
        return f"neither 'content' nor 'tool_calls' in {turn!r}"
    if unknown := turn.keys() - {"content", "tool_calls"}:
        return f"unknown keys {sorted(unknown)}"
    if not isinstance(turn.get("content"), str | None):
        return "'content' must be a string or null"
    calls = turn.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list) or not calls:
        return "'tool_calls' must be a non-empty list"
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return f"a tool call needs a 'name': {call!r}"
        if not isinstance(call.get("arguments", {}), dict | str):
            return "tool call arguments are an object or a JSON string"
        if unknown := call.keys() - {"name", "arguments"}:
            return f"unknown tool call keys {sorted(unknown)}"
    return None


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _tokens(text: str) -> int:
    # Words, not a tokenizer: usage only has to be plausible and deterministic.
    return len(text.split())


def _error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # close() hangs up open connections and joins with a deadline
    request_queue_size = 64

    def __init__(self, owner: ScriptedLLM, address: tuple[str, int]) -> None:
        self.owner = owner
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        self.owner._track(thread, request)
        thread.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.owner._untrack(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client hung up, or close() shut the socket
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are recorded; the console stays for the "listening on" line

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes | None:
        """The request body, by Content-Length or chunked; None when it cannot be read."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            # A wasi:http guest streams its request body, so it may come chunked.
            parts: list[bytes] = []
            while True:
                try:
                    size = int(self.rfile.readline(65537).split(b";", 1)[0].strip(), 16)
                except ValueError:
                    return None
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailer fields
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline(65537)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return None
        return self.rfile.read(length) if length >= 0 else None

    def _handle(self) -> None:
        raw = self._body()
        if raw is None:
            self.close_connection = True  # the framing is lost; this connection cannot go on
            status, payload, parsed = (
                400,
                _error("unreadable request body framing", "invalid_request_error"),
                None,
            )
        else:
            owner = self.server.owner
            if owner._holds(self.command, self.path):
                self.close_connection = True
                held = None
                with contextlib.suppress(ValueError):  # not JSON: recorded all the same
                    held = json.loads(raw)
                headers = list(self.headers.items())
                owner._record(RecordedRequest(self.command, self.path, headers, held, raw, 0))
                owner._hold()
                return  # hung up unanswered: the server is stopping
            status, payload, parsed = owner._answer(
                self.command, self.path, self.headers.get("Authorization"), raw
            )
        self.server.owner._record(
            RecordedRequest(
                method=self.command,
                path=self.path,
                headers=list(self.headers.items()),
                body=parsed,
                raw=raw or b"",
                status=status,
            )
        )
        self._send(status, payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle  # noqa: N815


class ScriptedLLM:
    """An OpenAI-compatible chat-completions server on loopback that answers from a script.

    ``script`` is a JSON file's path or a list of turns; ``key`` the API key every request must
    carry as ``Authorization: Bearer <key>`` (default: the ``SCRIPTED_LLM_KEY`` environment
    variable); ``model`` the model ``GET /v1/models`` lists; ``hold`` the number (from 1) of
    the chat completion request never answered (the server holds it until it stops, and sets
    ``holding``); ``on_request`` is called with each request once it is recorded.
    """

    def __init__(
        self,
        script: str | os.PathLike[str] | Sequence[Mapping[str, Any]] = DEFAULT_SCRIPT,
        *,
        key: str | None = None,
        model: str = "scripted-model",
        host: str = "127.0.0.1",
        port: int = 0,
        join_timeout: float = 5.0,
        hold: int | None = None,
        on_request: Callable[[RecordedRequest], None] | None = None,
    ) -> None:
        self.turns = load_script(script)
        key = key if key is not None else os.environ.get(KEY_ENV)
        if not key:
            raise ValueError(f"an API key is required: pass key= or set {KEY_ENV}")
        self.key = key
        self.model = model
        self._address = (host, port)
        self._join_timeout = join_timeout
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._httpd: _Server | None = None
        self._serve_thread: threading.Thread | None = None
        self._closed = False
        self._hold_at = hold
        self._completions = 0
        self.holding = threading.Event()
        """Set once the held request came."""
        self._released = threading.Event()
        self._on_request = on_request

    def start(self) -> Self:
        """Bind and start serving in a background thread (once)."""
        if self._httpd is not None or self._closed:
            raise RuntimeError("ScriptedLLM can be started once")
        self._httpd = _Server(self, self._address)
        self._serve_thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._serve_thread.start()
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The port the server listens on."""
        if self._httpd is None:
            raise RuntimeError("ScriptedLLM is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``http://HOST:PORT``, the server's origin."""
        if self._httpd is None:
            raise RuntimeError("ScriptedLLM is not running")
        return f"http://{self._address[0]}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``, what OpenAI clients take as their base URL."""
        return f"{self.url}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def close(self) -> None:
        """Stop serving, hang up open connections and join the handler threads."""
        self._closed = True
        self._released.set()
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections, threads = list(self._connections), list(self._threads)
        for conn in connections:
            with contextlib.suppress(OSError):  # already closed by its handler
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(self._join_timeout)

    def _track(self, thread: threading.Thread, conn: socket.socket) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            self._connections.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _holds(self, method: str, target: str) -> bool:
        """Whether this request is the chat completion to hold (counted from 1)."""
        if method != "POST" or target.split("?", 1)[0] != "/v1/chat/completions":
            return False
        with self._lock:
            self._completions += 1
            return self._completions == self._hold_at

    def _hold(self) -> None:
        self.holding.set()
        self._released.wait()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
        if self._on_request is not None:
            self._on_request(request)

    def _answer(
        self, method: str, target: str, authorization: str | None, raw: bytes
    ) -> tuple[int, dict[str, Any], Any]:
        """(status, JSON payload, parsed request body) for one request."""
        path = target.split("?", 1)[0]
        # Parsed whatever the answer, so a test sees what a refused request carried too.
        parsed, malformed = None, None
        try:
            parsed = json.loads(raw) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            malformed = exc
        routes = {"/v1/chat/completions": "POST", "/v1/models": "GET"}
        if path not in routes:
            return 404, _error(f"no route {path}", "invalid_request_error", "not_found"), parsed
        if authorization is None or not authorization.startswith("Bearer "):
            message = "You didn't provide an API key (Authorization: Bearer <key>)."
            return 401, _error(message, "invalid_request_error", "invalid_api_key"), parsed
        if authorization.removeprefix("Bearer ").strip() != self.key:
            message = "Incorrect API key provided."
            return 401, _error(message, "invalid_request_error", "invalid_api_key"), parsed
        if method != routes[path]:
            message = f"{method} is not allowed on {path}; use {routes[path]}"
            return 405, _error(message, "invalid_request_error", "method_not_allowed"), parsed
        if path == "/v1/models":
            model = {"id": self.model, "object": "model", "created": CREATED, "owned_by": "script"}
            return 200, {"object": "list", "data": [model]}, parsed
        if malformed is not None or not raw:
            message = f"malformed JSON body: {malformed or 'empty'}"
            return 400, _error(message, "invalid_request_error"), None
        status, payload = self._complete(parsed)
        return status, payload, parsed

    def _complete(self, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict):
            return 400, _error("the body must be a JSON object", "invalid_request_error")
        model, messages = body.get("model"), body.get("messages")
        if not isinstance(model, str):
            return 400, _error("'model' is required (a string)", "invalid_request_error")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return 400, _error("'messages' must be a list of objects", "invalid_request_error")
        if body.get("stream"):
            return 400, _error("this scripted server does not stream", "invalid_request_error")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn >= len(self.turns):
            message = (
                f"the script has {len(self.turns)} turns and this conversation already holds "
                f"{turn} assistant messages"
            )
            return 400, _error(message, "invalid_request_error", "script_exhausted")
        return 200, self._completion(turn, model, messages)

    def _completion(self, turn: int, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        step = self.turns[turn]
        tools = [m for m in messages if m.get("role") == "tool"]
        content = step.get("content")
        if content is not None:
            content = content.replace(PLACEHOLDER, _text(tools[-1].get("content")) if tools else "")
        message: dict[str, Any] = {"role": "assistant", "content": content}
        # Call ids count the tool calls of the turns before, so they are unique in a
        # conversation and the same on every replay of it.
        first = sum(len(t.get("tool_calls") or ()) for t in self.turns[:turn])
        calls: list[dict[str, Any]] = []
        for j, call in enumerate(step.get("tool_calls") or ()):
            arguments = call.get("arguments", {})
            calls.append(
                {
                    "id": f"call_{first + j}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else json.dumps(arguments),
                    },
                }
            )
        if calls:
            message["tool_calls"] = calls
        prompt = sum(_tokens(_text(m.get("content"))) for m in messages)
        completion = _tokens(content or "") + sum(
            _tokens(c["function"]["arguments"]) for c in calls
        )
        return {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


_PRINTING = threading.Lock()


def _say(line: str) -> None:
    """``line`` on stdout whole, flushed. The request log's lines come from the server's
    threads, and ``print`` writes a text and its newline in two writes: two requests at once
    once ran together on one line."""
    with _PRINTING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _print_request(request: RecordedRequest) -> None:
    """One line for a request (``--log-requests``)."""
    status = "held" if request.status == 0 else str(request.status)
    messages = request.body.get("messages") if isinstance(request.body, dict) else None
    line = f"{request.method} {request.path} -> {status}"
    if isinstance(messages, list):
        turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        line += f", turn {turn + 1}"
    _say(f"{line}, Idempotency-Key {request.header('Idempotency-Key') or '-'}")


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", default=str(DEFAULT_SCRIPT), help="the script's JSON file")
    parser.add_argument("--key", default=None, help=f"the API key (default: ${KEY_ENV})")
    parser.add_argument("--model", default="scripted-model", help="the model /v1/models lists")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--hold", type=int, default=None, metavar="N", help="never answer the N-th completion"
    )
    parser.add_argument(
        "--log-requests", action="store_true", help="print a line per request as it comes"
    )
    args = parser.parse_args(argv)
    try:
        server = ScriptedLLM(
            args.script,
            key=args.key,
            model=args.model,
            host=args.host,
            port=args.port,
            hold=args.hold,
            on_request=_print_request if args.log_requests else None,
        )
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    with server:
        # Flushed at once: whoever started the process reads the port from this line.
        _say(f"listening on {server.url}")
        if args.hold is not None:

            def announce() -> None:
                # Waits for the held request, or for the server to stop (no line then).
                while not stop.is_set():
                    if server.holding.wait(0.1):
                        _say(f"holding request {args.hold}")
                        return

            threading.Thread(target=announce, daemon=True).start()
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
