"""A real componentize-py guest on mighty's Python WASI: every interface, every grant, every escape."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from mighty import Budget, Component, Err, GuestExit, Instance, Ok
from mighty.gate import Seed
from mighty.wasi import STDOUT_SINK, OutputPolicy, Policy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def probe(probe_wasm: Path) -> Component:
    """The compiled probe guest."""
    return Component.load(probe_wasm)


def run(
    probe: Component, code: str, policy: Policy | None = None, slots: Iterable[Seed] = ()
) -> tuple[Any, Instance]:
    """Run a snippet in a fresh probe instance; return (Ok/Err value, instance)."""
    instance = Instance(probe, policy=policy, budget=Budget(timeout=30), slots=slots)
    return instance.call("run", code), instance


def ok(probe: Component, code: str, policy: Policy | None = None) -> str:
    """Run a snippet that must succeed; return its `result` as text."""
    value, _ = run(probe, code, policy)
    assert isinstance(value, Ok), value
    assert isinstance(value.value, str)
    return value.value


def test_nothing_is_granted_by_default(probe: Component) -> None:
    """With the default policy the guest sees no env, no args, no files and empty stdin."""
    text = ok(
        probe,
        "result = json.dumps([dict(os.environ), sys.argv, sys.stdin.read(), os.path.exists('/')])",
    )
    env, argv, stdin, has_root = json.loads(text)
    assert env == {}
    assert argv == []
    assert stdin == ""
    assert has_root is False


def test_env_args_and_stdin_are_exactly_the_policy(probe: Component) -> None:
    """Environment, arguments and stdin bytes are what the policy lists, nothing else."""
    policy = (
        Policy().with_env(GREETING="hi", EMPTY="").with_args("prog", "-v").with_stdin(b"\x00ab\xff")
    )
    text = ok(
        probe,
        "result = json.dumps([dict(os.environ), sys.argv, list(sys.stdin.buffer.read())])",
        policy,
    )
    env, argv, stdin = json.loads(text)
    assert env == {"GREETING": "hi", "EMPTY": ""}
    assert argv == ["prog", "-v"]
    assert bytes(stdin) == b"\x00ab\xff"


def test_stdout_and_stderr_are_captured(probe: Component) -> None:
    """print and sys.stderr.write land in the instance's captured streams, byte for byte."""
    value, instance = run(probe, "print('out', 'é'); sys.stderr.write('err\\n'); result = 1")
    assert value == Ok("1")
    assert instance.stdout.getvalue() == "out é\n".encode()
    assert instance.stderr.getvalue() == b"err\n"
    assert not instance.stdout.truncated


def test_output_cap_keeps_a_prefix_and_flags_truncation(probe: Component) -> None:
    """Past the cap, output is counted but not kept, and the capture says it was truncated."""
    policy = Policy(stdout=OutputPolicy(cap=100))
    value, instance = run(probe, "for i in range(100): print('x' * 99)\nresult = 0", policy)
    assert value == Ok("0")
    assert instance.stdout.getvalue() == (b"x" * 99 + b"\n")[:100]
    assert instance.stdout.truncated
    assert instance.stdout.total == 100 * 100


def test_output_sink_streams_every_chunk(probe: Component) -> None:
    """A sink receives all output as it is written, even beyond the cap."""
    chunks: list[bytes] = []
    policy = Policy(stdout=OutputPolicy(cap=10))
    run(probe, "for i in range(50): print(i)\nresult = 0", policy, [STDOUT_SINK.of(chunks.append)])
    assert b"".join(chunks) == "".join(f"{i}\n" for i in range(50)).encode()


def test_fixed_clock(probe: Component) -> None:
    """A fixed clock always reads the policy's start time."""
    policy = Policy().with_clock("fixed", start=1_234_567_890 * 10**9)
    text = ok(probe, "result = json.dumps([time.time(), time.time_ns()])", policy)
    assert json.loads(text) == [1_234_567_890.0, 1_234_567_890 * 10**9]


def test_virtual_clock_is_deterministic_and_advances(probe: Component) -> None:
    """A virtual clock moves forward and reads the same in two identical runs."""
    policy = Policy().with_clock("virtual")
    code = "a = time.monotonic_ns(); sum(range(10000)); b = time.monotonic_ns(); result = json.dumps([a, b, time.time_ns()])"
    first = json.loads(ok(probe, code, policy))
    second = json.loads(ok(probe, code, policy))
    assert first == second
    assert first[1] > first[0]


def test_real_clock_is_close_to_the_host(probe: Component) -> None:
    """The real clock reads the host's wall time."""
    import time

    text = ok(probe, "result = time.time()")
    assert abs(float(text) - time.time()) < 5


def test_seeded_random_is_deterministic(probe: Component) -> None:
    """With a seed, os.urandom, random and uuid4 repeat exactly; another seed differs."""
    code = "result = json.dumps([os.urandom(8).hex(), str(uuid.uuid4())])"
    a = ok(probe, code, Policy().with_seed(7))
    b = ok(probe, code, Policy().with_seed(7))
    c = ok(probe, code, Policy().with_seed(8))
    assert a == b
    assert a != c


def test_os_entropy_by_default(probe: Component) -> None:
    """Without a seed two runs draw different random bytes."""
    code = "result = os.urandom(16).hex()"
    assert ok(probe, code) != ok(probe, code)


def test_files_in_a_read_write_preopen(probe: Component, tmp_path: Path) -> None:
    """Create, write, seek, read, stat, list, rename, mkdir and unlink inside a granted dir."""
    (tmp_path / "seed.txt").write_text("seed")
    code = """
with open('/data/a.txt', 'w') as f:
    f.write('hello world')
with open('/data/a.txt', 'rb') as f:
    f.seek(6)
    tail = f.read()
os.mkdir('/data/sub')
os.rename('/data/a.txt', '/data/sub/b.txt')
size = os.stat('/data/sub/b.txt').st_size
listing = sorted(os.listdir('/data'))
seed = open('/data/seed.txt').read()
os.unlink('/data/seed.txt')
result = json.dumps([tail.decode(), size, listing, seed, sorted(os.listdir('/data'))])
"""
    text = ok(probe, code, Policy().with_dir(tmp_path, "/data", readonly=False))
    assert json.loads(text) == ["world", 11, ["seed.txt", "sub"], "seed", ["sub"]]
    assert (tmp_path / "sub" / "b.txt").read_text() == "hello world"
    assert not (tmp_path / "seed.txt").exists()


def test_read_only_preopen_refuses_every_write(probe: Component, tmp_path: Path) -> None:
    """In a read-only dir reads work and every kind of write fails inside the guest."""
    (tmp_path / "f.txt").write_text("x")
    code = """
outcomes = []
for attempt in (
    lambda: open('/ro/new.txt', 'w'),
    lambda: open('/ro/f.txt', 'a'),
    lambda: os.mkdir('/ro/d'),
    lambda: os.unlink('/ro/f.txt'),
    lambda: os.rename('/ro/f.txt', '/ro/g.txt'),
):
    try:
        attempt()
        outcomes.append('allowed')
    except OSError as e:
        outcomes.append('refused')
result = json.dumps([open('/ro/f.txt').read(), outcomes])
"""
    text = ok(probe, code, Policy().with_dir(tmp_path, "/ro", readonly=True))
    assert json.loads(text) == ["x", ["refused"] * 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


@pytest.mark.parametrize(
    "path",
    [
        "/data/../etc/passwd",
        "/data/sub/../../etc/passwd",
        "/etc/passwd",
        "/proc/self/environ",
        "/data/out/passwd",
        "/data/outdir/passwd",
        "/data/" + "a/" * 2000 + "x",
        "/data/" + "n" * 5000,
    ],
)
def test_escapes_fail(probe: Component, tmp_path: Path, path: str) -> None:
    """`..`, absolute paths, symlinks out of the root and absurd paths all fail to open."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "out").symlink_to("/etc")
    (root / "outdir").symlink_to(tmp_path)
    (tmp_path / "passwd").write_text("secret")
    code = f"""
try:
    data = open({path!r}).read()
    result = 'OPENED ' + data[:20]
except (OSError, ValueError) as e:
    result = 'refused ' + type(e).__name__
"""
    text = ok(probe, code, Policy().with_dir(root, "/data", readonly=False))
    assert text.startswith("refused"), text


def test_nul_in_path_is_refused(probe: Component, tmp_path: Path) -> None:
    """A NUL byte in a path never reaches the filesystem."""
    code = "\ntry:\n    open('/data/a\\x00b')\n    result = 'opened'\nexcept (OSError, ValueError) as e:\n    result = 'refused'\n"
    assert ok(probe, code, Policy().with_dir(tmp_path, "/data", readonly=False)) == "refused"


def test_in_memory_directory(probe: Component) -> None:
    """A memory dir is seeded from the policy and keeps the guest's writes in memory."""
    policy = Policy().with_memory_dir("/mem", {"in.txt": b"abc", "d/x.txt": b"x"})
    code = """
open('/mem/out.txt', 'w').write(open('/mem/in.txt').read().upper())
result = json.dumps([open('/mem/out.txt').read(), sorted(os.listdir('/mem')), open('/mem/d/x.txt').read()])
"""
    assert json.loads(ok(probe, code, policy)) == ["ABC", ["d", "in.txt", "out.txt"], "x"]


def test_exit_is_guest_exit(probe: Component) -> None:
    """os._exit in the guest ends the call with GuestExit."""
    instance = Instance(probe)
    with pytest.raises(GuestExit) as info:
        instance.call("run", "os._exit(3)")
    assert info.value.code != 0


def test_python_errors_come_back_as_err(probe: Component) -> None:
    """An exception in the snippet is returned as Err with its traceback."""
    value, _ = run(probe, "result = 1 / 0")
    assert isinstance(value, Err)
    assert "ZeroDivisionError" in value.value


def test_instances_do_not_share_state(probe: Component, tmp_path: Path) -> None:
    """Memory dirs and captured output belong to one instance."""
    policy = Policy().with_memory_dir("/mem")
    ok(probe, "open('/mem/x', 'w').write('1'); print('one'); result = 0", policy)
    value, instance = run(probe, "result = os.listdir('/mem')", policy)
    assert value == Ok("[]")
    assert instance.stdout.getvalue() == b""


def test_many_imports_keep_serving(probe: Component) -> None:
    """Thousands of import calls in one run all succeed (no leak of handles)."""
    instance = Instance(probe)
    assert instance.call("churn", 2000) == 6000
    assert instance.call("churn", 10) == 30


def test_host_environment_is_not_visible(probe: Component) -> None:
    """The host's own environment variables never reach the guest."""
    os.environ["MIGHTY_SECRET_TEST"] = "leak"
    try:
        assert ok(probe, "result = os.environ.get('MIGHTY_SECRET_TEST')") == "None"
    finally:
        del os.environ["MIGHTY_SECRET_TEST"]
