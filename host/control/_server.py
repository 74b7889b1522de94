"""The control socket server: a Unix stream socket, one thread per connection.

Security, in the order it applies:

1. The socket's directory must exist and must not let other users swap the file (not group- or
   world-writable unless sticky, like ``/tmp``).
2. An existing path is replaced only when it is our own *stale* socket (connecting is refused);
   a live socket, another user's socket, a symlink, a regular file or anything else is refused.
3. The socket is bound under umask 0o177, chmod-ed to 0o600, then verified with ``lstat`` (a
   socket, ours, mode 0o600); on any mismatch it is removed and we refuse to serve.
4. Each connection's peer uid (``SO_PEERCRED``) must equal ours; others get ``not_allowed``.

Per-connection bounds (issue 11): a request line is at most ``MAX_LINE`` bytes; at most
``MAX_CONNECTIONS`` connections are served at once (more get ``busy``); a connection that does not
complete a request within ``IDLE_TIMEOUT`` seconds of the last one (or of connecting) is closed,
however it trickles its bytes (32 idle or trickling connections used to lock the owner out).
A handler that takes a path from a request reads it with :func:`read_regular_file`:
a regular file below a size limit, opened without blocking on a FIFO and refused before a byte is
read if it is a device, a FIFO, a socket or too large (``reload`` of /dev/zero, a FIFO or a 1 GiB
file used to read it whole or block the handler).

Rejected: a selector loop with handlers on a pool (a slow handler still needs its own thread, and
per-connection threads keep replies on one connection in request order for free); asyncio (the
host is threaded; this must run beside the scheduler without owning an event loop).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from mighty._errors import BadInput
from mighty._files import FileRefused
from mighty._files import read_regular_file as _read_regular_file
from mighty.control._protocol import (
    ENV_VAR,
    MAX_LINE,
    LineBuffer,
    LineTooLong,
    ProtocolError,
    Request,
    decode_request,
    encode_error,
    encode_ok,
)

__all__ = [
    "BUILTIN_OPS",
    "IDLE_TIMEOUT",
    "MAX_CONNECTIONS",
    "MAX_FILE_BYTES",
    "ControlServer",
    "ControlSocketError",
    "FileRefused",
    "Handler",
    "PeerCred",
    "peer_is_allowed",
    "read_peer_cred",
    "read_regular_file",
]

_log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Any]
"""A control op: takes the request's ``args`` object, returns a JSON-able result or raises."""

BUILTIN_OPS = frozenset({"ping"})
MAX_CONNECTIONS = 32
"""Connections served at once; more get a ``busy`` reply and are closed."""
IDLE_TIMEOUT = 30.0
"""Seconds a connection may send nothing (between requests, or inside one) before it is closed."""
MAX_FILE_BYTES = 256 * 1024 * 1024
"""Largest file :func:`read_regular_file` reads unless told otherwise (a component, say)."""
# sun_path is 108 bytes on Linux, 104 on macOS, including the terminating NUL.
_MAX_SOCKET_PATH = 103
# Serialises the process-wide umask change, so two servers starting at once cannot restore
# each other's temporary umask.
_UMASK_LOCK = threading.Lock()


class ControlSocketError(BadInput):
    """The control socket cannot be served at that path; the message says why and what to do."""

    kind = "control_socket"


@dataclass(frozen=True)
class PeerCred:
    """The credentials of the process at the other end of a Unix socket."""

    pid: int
    uid: int
    gid: int


def read_peer_cred(sock: socket.socket) -> PeerCred | None:
    """The peer's credentials via ``SO_PEERCRED``; None where the platform does not offer it."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    size = struct.calcsize("3i")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, size))
    return PeerCred(pid, uid, gid)


def peer_is_allowed(cred: PeerCred | None, uid: int) -> bool:
    """Whether a peer with ``cred`` may use a server running as ``uid``: the same user only.

    Without credentials (no ``SO_PEERCRED``) the socket's 0o600 mode is the only guard, and the
    kernel already enforced it at connect time, so the peer is allowed.
    """
    if cred is None:
        return True
    return cred.uid == uid


class ControlServer:
    """Serve ``handlers`` (op name -> handler) on a Unix socket at ``path``, in the background.

    ``ping`` is built in and returns ``{"pong": true}``. A handler's exception becomes an error
    reply with kind ``getattr(exc, "kind", "internal")`` and message ``str(exc)``.
    """

    def __init__(self, path: str | Path, handlers: Mapping[str, Handler]) -> None:
        clash = BUILTIN_OPS & set(handlers)
        if clash:
            raise ControlSocketError(f"ops {sorted(clash)} are built in and cannot be replaced")
        self.path = Path(path)
        self._handlers: dict[str, Handler] = {"ping": _ping, **handlers}
        self._uid = os.getuid()
        # Who may connect; apart from _uid only so a test can play another user.
        self._allowed_uid = self._uid
        self._listener: socket.socket | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._inode: tuple[int, int] | None = None
        self._accept_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._state = "new"
        self.idle_timeout = IDLE_TIMEOUT
        """Seconds of silence after which a connection is closed (a test may shorten it)."""

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind the socket and start accepting; ControlSocketError if the path is unusable."""
        if self._state != "new":
            raise ControlSocketError(f"control server is {self._state}; make a new one")
        listener = _bind(self.path, self._uid)
        info = os.lstat(self.path)
        self._inode = (info.st_dev, info.st_ino)
        self._listener = listener
        self._wake = socket.socketpair()
        self._state = "running"
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"control-accept:{self.path.name}", daemon=True
        )
        self._accept_thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection, remove the socket file. Idempotent."""
        with self._lock:
            if self._state != "running":
                self._state = "stopped"
                return
            self._state = "stopped"
            listener, self._listener = self._listener, None
        assert listener is not None
        assert self._wake is not None
        # Closing a socket does not wake a thread blocked on it, so the accept loop selects on
        # the listener and this wake-up pair.
        _send_quietly(self._wake[1], b"x")
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        listener.close()
        for end in self._wake:
            end.close()
        with self._lock:
            connections = list(self._connections)
        # shutdown (unlike close) makes a connection thread's blocked recv return at once.
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        with self._lock:
            threads = list(self._threads)
        # A handler still running keeps its (daemon) thread; wait for it only up to the deadline.
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._unlink_if_ours()

    def __enter__(self) -> Self:
        if self._state == "new":
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the server is accepting connections."""
        return self._state == "running"

    def _unlink_if_ours(self) -> None:
        # Only remove the file we bound: another server may have replaced it after we stopped.
        try:
            info = os.lstat(self.path)
        except OSError:
            return
        if stat.S_ISSOCK(info.st_mode) and (info.st_dev, info.st_ino) == self._inode:
            with contextlib.suppress(OSError):
                self.path.unlink()

    # -- serving --------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        listener, wake = self._listener, self._wake
        assert listener is not None
        assert wake is not None
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            selector.register(wake[0], selectors.EVENT_READ)
            while self._state == "running":
                for key, _ in selector.select():
                    if key.fileobj is wake[0]:
                        return
                    self._accept_one(listener)

    def _accept_one(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            # EMFILE and friends: log and go on rather than kill the control plane.
            _log.warning("control socket accept failed", exc_info=True)
            time.sleep(0.05)
            return
        with self._lock:
            busy = len(self._connections) >= MAX_CONNECTIONS
            if not busy:
                self._connections.add(conn)
        if busy:
            message = f"more than {MAX_CONNECTIONS} control connections are open"
            _send_quietly(conn, encode_error(None, "busy", message))
            conn.close()
            return
        thread = threading.Thread(
            target=self._serve, args=(conn,), name="control-conn", daemon=True
        )
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if not peer_is_allowed(read_peer_cred(conn), self._allowed_uid):
                message = "this control socket serves its owner only"
                _send_quietly(conn, encode_error(None, "not_allowed", message))
                _drain(conn)
                return
            buffer = LineBuffer(MAX_LINE)
            # A peer costs a thread and one of MAX_CONNECTIONS places: it gets a budget for
            # each whole request, from the end of the last one, not for the gap between bytes
            # (32 peers trickling a byte every 10 s were never idle and locked the owner out).
            started = time.monotonic()
            while True:
                left = self.idle_timeout - (time.monotonic() - started)
                try:
                    if left <= 0:
                        raise TimeoutError
                    conn.settimeout(left)
                    data = conn.recv(65536)
                except TimeoutError:
                    message = f"no whole request within {self.idle_timeout:g} s; closing"
                    _send_quietly(conn, encode_error(None, "idle_timeout", message))
                    return
                if not data:
                    return
                try:
                    lines = buffer.feed(data)
                except LineTooLong as exc:
                    # The rest of the stream cannot be framed any more, so the connection ends.
                    _send_quietly(conn, encode_error(None, exc.kind, exc.message))
                    _drain(conn)
                    return
                for line in lines:
                    if line.strip():
                        conn.sendall(self._answer(line))
                    started = time.monotonic()
        except OSError:
            pass  # the client went away, or stop() shut the connection down
        finally:
            with self._lock:
                self._connections.discard(conn)
                self._threads.discard(threading.current_thread())
            conn.close()

    def _answer(self, line: bytes) -> bytes:
        try:
            request = decode_request(line)
        except ProtocolError as exc:
            return encode_error(exc.request_id, exc.kind, exc.message)
        return self._call(request)

    def _call(self, request: Request) -> bytes:
        handler = self._handlers.get(request.op)
        if handler is None:
            known = ", ".join(sorted(self._handlers))
            return encode_error(
                request.id, "unknown_op", f"no op {request.op!r}; known ops: {known}"
            )
        try:
            result = handler(request.args)
        except Exception as exc:  # noqa: BLE001 -- every handler failure must become a reply
            kind = getattr(exc, "kind", "internal")
            if not isinstance(kind, str):
                kind = "internal"
            if kind == "internal":
                _log.error("control op %r failed", request.op, exc_info=exc)
            return encode_error(request.id, kind, str(exc) or type(exc).__name__)
        try:
            return encode_ok(request.id, result)
        except (TypeError, ValueError, RecursionError) as exc:
            return encode_error(
                request.id,
                "internal",
                f"op {request.op!r} returned a result that is not JSON: {exc}",
            )


def read_regular_file(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``max_bytes``, else FileRefused
    (mighty's one reader of untrusted paths: no blocking on FIFOs, no devices, size first)."""
    return _read_regular_file(path, max_bytes)


def _ping(args: dict[str, Any]) -> dict[str, bool]:
    return {"pong": True}


def _drain(conn: socket.socket, limit: int = 4 * MAX_LINE, timeout: float = 1.0) -> None:
    """Half-close, then read and drop what the peer still sends, within bounds.

    Closing a Unix socket with unread data resets the peer, and a reset peer may never read the
    error reply we just sent; reading until its EOF (or a bound) lets the reply arrive.
    """
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while limit > 0 and time.monotonic() < deadline:
            data = conn.recv(65536)
            if not data:
                return
            limit -= len(data)


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(data)


# -- binding -------------------------------------------------------------------------------------


def _bind(path: Path, uid: int) -> socket.socket:
    """A listening socket at ``path``, there only once it listens: bound and set up under a
    private name beside it, then linked into place (a client that sees the file can connect)."""
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise ControlSocketError(
            f"control socket path {str(path)!r} is longer than {_MAX_SOCKET_PATH} bytes,"
            f" the limit for Unix sockets; choose a shorter path"
        )
    _check_directory(path.parent)
    _clear_stale(path, uid)
    staging = path.parent / f".mty-{os.getpid()}-{os.urandom(4).hex()}"
    if len(os.fsencode(staging)) > _MAX_SOCKET_PATH:
        staging = path  # no room for a private name: bind in place (connects may be refused
        # for the moment between bind and listen; clients retry)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _UMASK_LOCK:
            # bind creates the file with the umask applied; 0o177 leaves 0o600 from the start,
            # so there is no moment when another user could connect.
            old_umask = os.umask(0o177)
            try:
                listener.bind(os.fspath(staging))
            finally:
                os.umask(old_umask)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise ControlSocketError(
                f"{path} appeared while binding; another process is starting a control socket there"
            ) from exc
        raise ControlSocketError(f"cannot bind control socket {path}: {exc}") from exc
    try:
        os.chmod(staging, 0o600)
        _verify(staging, uid)
        listener.listen(16)
        if staging != path:
            try:
                os.link(staging, path)  # fails if another process put a file there meanwhile
            except FileExistsError:
                raise ControlSocketError(
                    f"{path} appeared while binding; another process is starting a control"
                    " socket there"
                ) from None
            finally:
                with contextlib.suppress(OSError):
                    staging.unlink()
    except (OSError, ControlSocketError):
        listener.close()
        with contextlib.suppress(OSError):
            staging.unlink()
        raise
    return listener


def _check_directory(directory: Path) -> None:
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        raise ControlSocketError(
            f"directory {directory} of the control socket does not exist; create it first"
        ) from None
    except OSError as exc:
        raise ControlSocketError(f"cannot use directory {directory}: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ControlSocketError(f"{directory} is not a directory")
    # Others who can write the directory could unlink our socket and put theirs in its place,
    # unless the sticky bit (as on /tmp) restricts removal to the owner.
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise ControlSocketError(
            f"directory {directory} is writable by other users (mode"
            f" {stat.S_IMODE(info.st_mode):o}); put the control socket in a private directory"
        )


def _clear_stale(path: Path, uid: int) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ControlSocketError(f"cannot inspect {path}: {exc}") from exc
    if not stat.S_ISSOCK(info.st_mode):
        raise ControlSocketError(
            f"{path} exists and is not a socket ({_describe(info.st_mode)}); refusing to replace"
            f" it; choose another path for {ENV_VAR}"
        )
    if info.st_uid != uid:
        raise ControlSocketError(
            f"{path} is a socket owned by another user (uid {info.st_uid}); refusing to replace it"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(os.fspath(path))
    except ConnectionRefusedError:
        pass  # nothing listening: a stale socket left by a run that did not clean up
    except OSError as exc:
        raise ControlSocketError(
            f"{path} is a socket that cannot be probed ({exc}); refusing to replace it"
        ) from exc
    else:
        raise ControlSocketError(
            f"{path} is a live socket: another process is serving it; stop that run or choose"
            f" another path for {ENV_VAR}"
        )
    finally:
        probe.close()
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ControlSocketError(f"cannot remove stale socket {path}: {exc}") from exc


def _verify(path: Path, uid: int) -> None:
    info = os.lstat(path)
    problems = []
    if not stat.S_ISSOCK(info.st_mode):
        problems.append(f"is {_describe(info.st_mode)}, not a socket")
    if info.st_uid != uid:
        problems.append(f"is owned by uid {info.st_uid}, not {uid}")
    if stat.S_IMODE(info.st_mode) != 0o600:
        problems.append(f"has mode {stat.S_IMODE(info.st_mode):o}, not 600")
    if problems:
        raise ControlSocketError(
            f"control socket {path} {' and '.join(problems)}; refusing to serve"
        )


def _describe(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"
