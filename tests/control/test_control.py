"""The control socket: protocol framing and errors, server security checks, and the client."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mighty.control
from mighty._errors import BadInput, HostError
from mighty.control import ENV_VAR, PROTOCOL_VERSION, ControlError, ControlServer, request
from mighty.control._protocol import (
    MAX_LINE,
    LineBuffer,
    LineTooLong,
    ProtocolError,
    decode_reply,
    decode_request,
    encode_error,
    encode_ok,
    encode_request,
)
from mighty.control._server import (
    ControlSocketError,
    PeerCred,
    peer_is_allowed,
    read_peer_cred,
)


class Boom(Exception):
    """A handler error with its own kind."""

    kind = "boom"


def _fail(args: dict[str, Any]) -> Any:
    raise Boom(f"failed with {args.get('n')}")


def _crash(args: dict[str, Any]) -> Any:
    raise KeyError("missing")


HANDLERS: dict[str, Any] = {
    "echo": lambda args: args,
    "fail": _fail,
    "crash": _crash,
    "not_json": lambda args: {1, 2},
}


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    """A socket path in a private temporary directory."""
    return tmp_path / "ctl.sock"


@pytest.fixture
def server(sock_path: Path) -> Iterator[ControlServer]:
    """A running server with the test handlers."""
    with ControlServer(sock_path, HANDLERS) as srv:
        yield srv


def raw_exchange(path: Path, payload: bytes) -> list[dict[str, Any]]:
    """Send raw bytes, then read reply lines until the server closes or a second passes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(os.fspath(path))
        # The server may close early (oversize line); its reply is still buffered for us.
        with contextlib.suppress(BrokenPipeError):
            sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines() if line.strip()]


# -- public names --------------------------------------------------------------------------------


def test_public_names() -> None:
    """The package exports exactly its documented names."""
    assert sorted(mighty.control.__all__) == sorted(
        [
            "ENV_VAR",
            "PROTOCOL_VERSION",
            "SORT_KEYS",
            "ControlError",
            "ControlServer",
            "ControlSocketError",
            "FileRefused",
            "IDLE_TIMEOUT",
            "MAX_ADDRESS",
            "MAX_ASK_TIMEOUT",
            "MAX_FILE_BYTES",
            "UnknownAgent",
            "application_ops",
            "read_regular_file",
            "request",
            "runtime_ops",
            "sort_rows",
            "top_rows",
        ]
    )
    assert ENV_VAR == "RUNTIME_CONTROL_SOCK"
    assert PROTOCOL_VERSION == 1
    assert issubclass(ControlError, HostError)
    assert issubclass(ControlSocketError, BadInput)


# -- protocol, without sockets -------------------------------------------------------------------


def test_request_encoding_round_trips() -> None:
    """An encoded request decodes to the same id, op and args."""
    line = encode_request(7, "status", {"a": [1, 2]})
    assert line.endswith(b"\n")
    decoded = decode_request(line.rstrip(b"\n"))
    assert (decoded.id, decoded.op, decoded.args) == (7, "status", {"a": [1, 2]})


@pytest.mark.parametrize(
    ("line", "kind", "request_id"),
    [
        (b"{not json", "bad_request", None),
        (b"\xff\xfe", "bad_request", None),
        (b"[1]", "bad_request", None),
        (b'{"version": 1, "op": "x"}', "bad_request", None),
        (b'{"version": 1, "id": true, "op": "x"}', "bad_request", None),
        (b'{"id": 3, "op": "x"}', "bad_request", 3),
        (b'{"version": 2, "id": 3, "op": "x"}', "version_mismatch", 3),
        (b'{"version": 1, "id": 3}', "bad_request", 3),
        (b'{"version": 1, "id": 3, "op": "x", "args": [1]}', "bad_request", 3),
        (b"[" * 100_000, "bad_request", None),
    ],
)
def test_bad_requests_are_protocol_errors(line: bytes, kind: str, request_id: int | None) -> None:
    """Each malformed request raises ProtocolError with a kind and the id when it was readable."""
    with pytest.raises(ProtocolError) as info:
        decode_request(line)
    assert info.value.kind == kind
    assert info.value.request_id == request_id


def test_replies_round_trip() -> None:
    """ok and error replies decode to what was encoded, version included."""
    ok = decode_reply(encode_ok(4, {"x": 1}).rstrip())
    assert (ok.id, ok.ok, ok.result) == (4, True, {"x": 1})
    err = decode_reply(encode_error(None, "boom", "it broke").rstrip())
    assert (err.id, err.ok, err.kind, err.message) == (None, False, "boom", "it broke")
    assert json.loads(encode_ok(1, None))["version"] == PROTOCOL_VERSION


def test_reply_of_another_version_is_refused() -> None:
    """A client refuses a reply in a protocol version it does not speak."""
    with pytest.raises(ControlError) as info:
        decode_reply(b'{"version": 9, "id": 1, "ok": true, "result": null}')
    assert info.value.kind == "version_mismatch"


def test_line_buffer_splits_and_limits() -> None:
    """Lines split across feeds are joined; a line past the limit raises, with or without newline."""
    buffer = LineBuffer(limit=10)
    assert buffer.feed(b"ab") == []
    assert buffer.feed(b"c\nde\nf") == [b"abc", b"de"]
    assert buffer.pending == 1
    with pytest.raises(LineTooLong):
        buffer.feed(b"x" * 10)
    with pytest.raises(LineTooLong):
        LineBuffer(limit=4).feed(b"12345\n")
    assert LineBuffer(limit=4).feed(b"1234\n") == [b"1234"]


@given(st.lists(st.binary(max_size=20).filter(lambda b: b"\n" not in b), max_size=10), st.data())
def test_line_buffer_recovers_lines_under_any_chunking(
    lines: list[bytes], data: st.DataObject
) -> None:
    """However the stream is cut into chunks, the same lines come out."""
    stream = b"".join(line + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))
    buffer = LineBuffer(limit=100)
    out: list[bytes] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out += buffer.feed(stream[start:end])
    assert out == lines


@given(st.binary(max_size=300))
def test_decode_request_raises_only_protocol_error(line: bytes) -> None:
    """Random bytes decode to a request or raise ProtocolError, never anything else."""
    with contextlib.suppress(ProtocolError):
        decode_request(line)


# -- server and client ---------------------------------------------------------------------------


def test_ping_round_trip(server: ControlServer, sock_path: Path) -> None:
    """The built-in ping answers pong."""
    assert request(sock_path, "ping") == {"pong": True}


def test_handler_gets_args(server: ControlServer, sock_path: Path) -> None:
    """A handler receives the request's args and its result comes back."""
    assert request(sock_path, "echo", {"a": [1, "b"]}) == {"a": [1, "b"]}
    assert request(sock_path, "echo") == {}


def test_every_reply_carries_version_and_id(server: ControlServer, sock_path: Path) -> None:
    """Ok, error and malformed-request replies all carry the version and the request's id."""
    lines = [
        {"version": 1, "id": 1, "op": "ping"},
        {"version": 1, "id": 2, "op": "fail", "args": {"n": 1}},
        {"version": 1, "id": 3, "op": "nope"},
        {"version": 2, "id": 4, "op": "ping"},
    ]
    payload = b"".join(json.dumps(line).encode() + b"\n" for line in lines) + b"garbage\n"
    replies = raw_exchange(sock_path, payload)
    assert [r["id"] for r in replies] == [1, 2, 3, 4, None]
    assert all(r["version"] == PROTOCOL_VERSION for r in replies)
    assert [r["ok"] for r in replies] == [True, False, False, False, False]


def test_version_mismatch_names_both_versions(server: ControlServer, sock_path: Path) -> None:
    """A request in another protocol version gets version_mismatch naming both versions."""
    (reply,) = raw_exchange(sock_path, b'{"version": 2, "id": 5, "op": "ping"}\n')
    assert reply["error"]["kind"] == "version_mismatch"
    assert "version 2" in reply["error"]["message"]
    assert "version 1" in reply["error"]["message"]
    assert reply["id"] == 5


def test_malformed_json_gets_an_error_and_the_connection_goes_on(
    server: ControlServer, sock_path: Path
) -> None:
    """Malformed JSON gets a bad_request reply; later requests on the connection still work."""
    replies = raw_exchange(sock_path, b'{"version": 1,\n{"version": 1, "id": 2, "op": "ping"}\n')
    assert replies[0]["error"]["kind"] == "bad_request"
    assert replies[1]["result"] == {"pong": True}
    assert request(sock_path, "ping") == {"pong": True}


def test_oversize_line_gets_an_error_and_a_close(server: ControlServer, sock_path: Path) -> None:
    """A line longer than 1 MiB gets a too_large reply, then the server closes the connection."""
    replies = raw_exchange(
        sock_path, b"x" * (MAX_LINE + 1) + b'\n{"version":1,"id":1,"op":"ping"}\n'
    )
    assert len(replies) == 1
    assert replies[0]["error"]["kind"] == "too_large"
    assert request(sock_path, "ping") == {"pong": True}


def test_handler_errors_become_error_replies(server: ControlServer, sock_path: Path) -> None:
    """A handler's exception is a reply with its kind (or internal) and message."""
    with pytest.raises(ControlError) as info:
        request(sock_path, "fail", {"n": 3})
    assert (info.value.kind, info.value.message) == ("boom", "failed with 3")
    with pytest.raises(ControlError) as info:
        request(sock_path, "crash")
    assert info.value.kind == "internal"
    assert "missing" in info.value.message
    with pytest.raises(ControlError) as info:
        request(sock_path, "not_json")
    assert info.value.kind == "internal"
    assert "not JSON" in info.value.message
    with pytest.raises(ControlError) as info:
        request(sock_path, "nope")
    assert info.value.kind == "unknown_op"
    assert "ping" in info.value.message
    assert request(sock_path, "ping") == {"pong": True}


def test_slow_handler_does_not_block_other_clients(sock_path: Path) -> None:
    """While one client waits on a slow handler, another client is answered."""
    entered, release = threading.Event(), threading.Event()

    def slow(args: dict[str, Any]) -> str:
        entered.set()
        release.wait(10)
        return "done"

    results: list[Any] = []
    with ControlServer(sock_path, {"slow": slow}):
        waiter = threading.Thread(target=lambda: results.append(request(sock_path, "slow")))
        waiter.start()
        assert entered.wait(5)
        assert request(sock_path, "ping", timeout=5) == {"pong": True}
        assert results == []
        release.set()
        waiter.join(5)
    assert results == ["done"]


def test_client_times_out(sock_path: Path) -> None:
    """A reply slower than the client's timeout raises ControlError kind timeout."""
    release = threading.Event()
    with ControlServer(sock_path, {"slow": lambda args: release.wait(10)}):
        with pytest.raises(ControlError) as info:
            request(sock_path, "slow", timeout=0.2)
        release.set()
    assert info.value.kind == "timeout"


def test_socket_mode_is_0600_and_removed_on_stop(sock_path: Path) -> None:
    """The socket file is 0600 while serving and gone after stop."""
    with ControlServer(sock_path, {}) as srv:
        info = os.lstat(sock_path)
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == os.getuid()
        assert srv.running
    assert not sock_path.exists()
    assert not srv.running
    srv.stop()  # idempotent


def test_umask_is_restored(sock_path: Path) -> None:
    """Starting a server leaves the process umask as it was."""
    before = os.umask(0o022)
    os.umask(before)
    with ControlServer(sock_path, {}):
        now = os.umask(before)
        os.umask(now)
    assert now == before


def test_stale_socket_is_replaced(sock_path: Path) -> None:
    """A socket file nobody listens on (a crashed run) is replaced."""
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.fspath(sock_path))
    stale.close()
    assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    with ControlServer(sock_path, {}):
        assert request(sock_path, "ping") == {"pong": True}


def test_live_socket_is_refused(server: ControlServer, sock_path: Path) -> None:
    """A second server on a live socket's path is refused, and the first keeps serving."""
    with pytest.raises(ControlSocketError, match="live socket"):
        ControlServer(sock_path, {}).start()
    assert request(sock_path, "ping") == {"pong": True}


def test_regular_file_is_refused(sock_path: Path) -> None:
    """A regular file at the path is never replaced."""
    sock_path.write_text("keep me")
    with pytest.raises(ControlSocketError, match="regular file"):
        ControlServer(sock_path, {}).start()
    assert sock_path.read_text() == "keep me"


def test_symlink_is_refused(tmp_path: Path, sock_path: Path) -> None:
    """A symbolic link at the path is refused, not followed."""
    sock_path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ControlSocketError, match="symbolic link"):
        ControlServer(sock_path, {}).start()


def test_missing_or_shared_directory_is_refused(tmp_path: Path) -> None:
    """A missing directory, or one other users may write without the sticky bit, is refused."""
    with pytest.raises(ControlSocketError, match="does not exist"):
        ControlServer(tmp_path / "nope" / "ctl.sock", {}).start()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ControlSocketError, match="writable by other users"):
        ControlServer(shared / "ctl.sock", {}).start()
    shared.chmod(0o1777)  # sticky, like /tmp: others cannot remove our file
    with ControlServer(shared / "ctl.sock", {}):
        assert request(shared / "ctl.sock", "ping") == {"pong": True}


def test_overlong_path_is_refused(tmp_path: Path) -> None:
    """A path past the Unix socket length limit gets a clear error, not an OSError."""
    with pytest.raises(ControlSocketError, match="longer than"):
        ControlServer(tmp_path / ("x" * 120), {}).start()


def test_builtin_ops_cannot_be_replaced(sock_path: Path) -> None:
    """Passing a handler named ping is refused."""
    with pytest.raises(ControlSocketError, match="built in"):
        ControlServer(sock_path, {"ping": lambda args: None})


def test_client_errors_when_nothing_serves(tmp_path: Path, sock_path: Path) -> None:
    """No socket, or a stale one, gives ControlError kind unavailable with a clear message."""
    with pytest.raises(ControlError) as info:
        request(sock_path, "ping")
    assert info.value.kind == "unavailable"
    assert ENV_VAR in info.value.message
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.fspath(sock_path))
    stale.close()
    with pytest.raises(ControlError) as info:
        request(sock_path, "ping")
    assert info.value.kind == "unavailable"
    assert "nothing is listening" in info.value.message


# -- peer credentials ----------------------------------------------------------------------------


def test_peer_check_allows_only_the_same_user() -> None:
    """The same uid is allowed; any other uid, root included, is not."""
    me = 1000
    assert peer_is_allowed(PeerCred(pid=1, uid=me, gid=1), me)
    assert not peer_is_allowed(PeerCred(pid=1, uid=me + 1, gid=1), me)
    assert not peer_is_allowed(PeerCred(pid=1, uid=0, gid=0), me)
    # No credentials (no SO_PEERCRED): the socket mode already kept others out.
    assert peer_is_allowed(None, me)


@pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED"), reason="SO_PEERCRED is Linux-only")
def test_peer_cred_reads_this_process() -> None:
    """SO_PEERCRED on a socket pair reports this process's pid and uid."""
    a, b = socket.socketpair()
    with a, b:
        cred = read_peer_cred(a)
    assert cred == PeerCred(os.getpid(), os.getuid(), os.getgid())


def test_other_user_gets_not_allowed(sock_path: Path) -> None:
    """A connection whose uid differs from the server's gets not_allowed, then a close."""
    srv = ControlServer(sock_path, {})
    # Tests run as one user, so pretend the server runs as someone else.
    srv._allowed_uid = os.getuid() + 1
    with srv:
        replies = raw_exchange(sock_path, b'{"version":1,"id":1,"op":"ping"}\n')
    assert len(replies) == 1
    assert replies[0]["error"]["kind"] == "not_allowed"
