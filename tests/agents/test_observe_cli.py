"""`mty inspect` and `mty top` against a real `mty run --keep-running` over its control socket;
`mty top` also driven in a real pseudo-terminal."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mighty import Component

ROOT = Path(__file__).resolve().parents[2]
_HANDLE = (
    '(func (export "handle") (param i32 i32 i32 i32 i32 i32) (result i32)'
    " (local $r i32) (local $name i32)"
)
_SPIN = """
      (if (i32.and (i32.eq (local.get 3) (i32.const 4))
                   (i32.eq (i32.load8_u (local.get 2)) (i32.const 0x73)))
        (then (loop $forever (br $forever))))"""


@pytest.fixture(scope="module")
def spinner_wasm(wat: Callable[[str], bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The WAT echo agent whose "spin" message loops until its deadline, as a file."""
    text = (ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()
    path = tmp_path_factory.mktemp("spinner") / "spinner.wasm"
    path.write_bytes(wat(text.replace(_HANDLE, _HANDLE + _SPIN)))
    Component.load(path)  # compiled once here, so the runs below start fast
    return path


def mty(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mighty.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


@contextlib.contextmanager
def running(manifest: Path, sock: Path) -> Iterator[subprocess.Popen[str]]:
    """`mty run --keep-running` with its control socket at ``sock``, until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mighty.cli", "run", str(manifest), "--keep-running", "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RUNTIME_CONTROL_SOCK": str(sock)},
    )
    assert proc.stderr is not None
    seen = []
    try:
        while True:
            line = proc.stderr.readline()
            seen.append(line)
            assert line, f"mty run ended early: {''.join(seen)}"
            if line.startswith("mty: running"):
                break
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Unix socket paths are short (108 bytes): pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="mty-obs-", dir="/tmp") as name:
        os.chmod(name, 0o700)
        yield Path(name)


@pytest.fixture
def manifest(tmp_path: Path, spinner_wasm: Path, counter_wasm: Path) -> Path:
    """A spinner stuck in its handler and a counter kept busy by 200 slow messages (tens of
    seconds of work in all, so it is still busy when `top` samples it, however fast or loaded
    the machine: with 200,000 iterations each, all 200 were sometimes done before `top` ran)."""
    work = "".join(
        '[[start]]\nto = "counter"\nmessage = "work"\nbody = { n = 1000000 }\nask = false\n\n'
        for _ in range(200)
    )
    path = tmp_path / "mighty.toml"
    path.write_text(
        "workers = 2\n\n"
        f'[agents.spin]\ncomponent = "{spinner_wasm}"\ntimeout = 60.0\nfuel = 1000000000000000\n'
        "mailbox = { capacity = 4 }\n\n"
        f'[agents.counter]\ncomponent = "{counter_wasm}"\n'
        'accepts = ["incr", "get", "work"]\n\n'
        "[supervisor]\nchildren = [\n"
        '  { name = "looper", type = "spin" },\n'
        '  { name = "counter", type = "counter" },\n]\n\n'
        '[[start]]\nto = "looper"\nmessage = "spin"\nask = false\n\n' + work
    )
    return path


def test_inspect_and_top_against_a_running_runtime(manifest: Path, sock_dir: Path) -> None:
    """inspect (one agent, the tree, JSON and text) and top --once --json answer while an agent
    is stuck in a long loop; an unknown agent is one line and exit 2."""
    sock = sock_dir / "c.sock"
    with running(manifest, sock):
        deadline = time.monotonic() + 60
        while True:
            done = mty("inspect", "looper", "--socket", str(sock), "--json")
            assert done.returncode == 0, done.stderr
            snap = json.loads(done.stdout)
            counter = json.loads(mty("inspect", "counter", "--socket", str(sock), "--json").stdout)
            if snap["in_flight"] is not None and counter["handled"] > 0:
                break
            assert time.monotonic() < deadline, snap
            time.sleep(0.1)
        assert snap["version"] == 1
        assert snap["state"] == "running"
        assert snap["in_flight"]["message"] == "spin"
        assert snap["parent"] == "root"

        tree = json.loads(mty("inspect", "--json", env={"RUNTIME_CONTROL_SOCK": str(sock)}).stdout)
        assert {a["name"] for a in tree["agents"]} == {"looper", "counter"}
        assert tree["supervisors"] == [{"name": "root", "parent": None}]
        busy = [w for w in tree["workers"] if w["current"] is not None]
        assert any(w["current"] == snap["address"] for w in busy)

        text = mty("inspect", "--socket", str(sock))
        assert text.returncode == 0, text.stderr
        assert "supervisor root" in text.stdout
        assert f"{snap['address']} (looper)" in text.stdout
        assert "handling spin" in text.stdout
        assert "worker-0" in text.stdout

        one = mty("inspect", "counter", "--socket", str(sock))
        assert one.returncode == 0, one.stderr
        assert "last " in one.stdout
        assert "work from host: ok" in one.stdout

        # A 2 s sample: a message of the counter's takes ~0.1 s idle, several times more loaded.
        top = mty("top", "--once", "--json", "--interval", "2", "--socket", str(sock))
        assert top.returncode == 0, top.stderr
        frame = json.loads(top.stdout)
        rows = {r["name"]: r for r in frame["agents"]}
        assert rows["looper"]["state"] == "running"
        assert rows["counter"]["msgs_per_s"] > 0
        assert rows["counter"]["fuel_per_s"] > 0
        assert rows["counter"]["memory"] > 0
        assert len(frame["workers"]) >= 2

        missing = mty("inspect", "nobody", "--socket", str(sock))
        assert missing.returncode == 2
        assert missing.stderr.count("\n") == 1
        assert "nobody" in missing.stderr
        assert "Traceback" not in missing.stderr


def test_inspect_with_nothing_listening_is_one_line(sock_dir: Path) -> None:
    """No socket, or a stale one: one line naming the path, exit 1; no socket given: exit 2."""
    done = mty("inspect", "--socket", str(sock_dir / "none.sock"))
    assert done.returncode == 1
    assert "none.sock" in done.stderr
    assert done.stderr.count("\n") == 1
    env = {k: v for k, v in os.environ.items() if k != "RUNTIME_CONTROL_SOCK"}
    bare = subprocess.run(
        [sys.executable, "-m", "mighty.cli", "top", "--once"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert bare.returncode == 2
    assert "RUNTIME_CONTROL_SOCK" in bare.stderr
    bad = mty("top", "--once", "--sort", "colour", "--socket", str(sock_dir / "x"))
    assert bad.returncode == 2
    assert "colour" in bad.stderr


def _read_until(fd: int, predicate: Callable[[bytes], bool], limit: float = 60.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + limit
    while not predicate(seen):
        left = deadline - time.monotonic()
        assert left > 0, (
            f"terminal never showed what was expected:\n{seen.decode(errors='replace')}"
        )
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def _top_in_pty(sock: Path) -> tuple[int, int]:
    """Start `mty top` on a fresh pseudo-terminal; (pid, master fd)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: become `mty top` on the terminal
        os.environ.update({"TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"})
        os.execv(
            sys.executable,
            [sys.executable, "-m", "mighty.cli", "top", "--interval", "0.3", "--socket", str(sock)],
        )
    return pid, fd


def _wait_exit(pid: int, fd: int) -> int:
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("mty top did not quit")
        with contextlib.suppress(OSError):
            if select.select([fd], [], [], 0.1)[0]:
                os.read(fd, 65536)  # keep the terminal drained so the child never blocks


def test_top_in_a_real_terminal_draws_refreshes_and_quits(manifest: Path, sock_dir: Path) -> None:
    """In a pty, `mty top` draws the table, redraws it, re-sorts on s, quits on q (0) and on
    Ctrl-C (130); a runtime stopping under it is one line and exit 1."""
    sock = sock_dir / "c.sock"
    with running(manifest, sock) as run:
        pid, fd = _top_in_pty(sock)
        try:
            seen = _read_until(fd, lambda b: b.count(b"mty top:") >= 3 and b"looper" in b)
            assert b"worker-0" in seen
            assert b"msgs/s" in seen
            os.write(fd, b"s")  # sort by the next column: redrawn at once with its name
            _read_until(fd, lambda b: b"sorted by type" in b)
            os.write(fd, b"q")
            assert _wait_exit(pid, fd) == 0
        finally:
            os.close(fd)

        pid, fd = _top_in_pty(sock)
        try:
            _read_until(fd, lambda b: b"mty top:" in b)
            os.kill(pid, signal.SIGINT)
            assert _wait_exit(pid, fd) == 130
        finally:
            os.close(fd)

        # The runtime stopping under a live `mty top`: one line, exit 1, no traceback.
        pid, fd = _top_in_pty(sock)
        try:
            _read_until(fd, lambda b: b"mty top:" in b)
            run.send_signal(signal.SIGINT)
            run.communicate(timeout=60)
            seen = _read_until(fd, lambda b: b"went away" in b)
            assert _wait_exit(pid, fd) == 1
        finally:
            os.close(fd)
        assert b"Traceback" not in seen
