"""The sync tool call's fast path: the guest stub's scalar path, the host's in-place binding,
and the pipes a call waits on (a late answer of a timed-out call, closed pipes)."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty.sandbox import Limits, Sandbox, Tool
from mighty.sandbox._tools import _WORKERS, InvalidArgument, _Bell

pytestmark = pytest.mark.slow


def two(a: Any, b: Any) -> list[Any]:
    return [a, b]


def named(a: Any, *, k: Any, o: Any = 1) -> list[Any]:
    return [a, k, o]


def none() -> int:
    return 7


def typed(a: int, b: str) -> str:
    return f"{a}:{b}"


@pytest.fixture(scope="module")
def box(interpreter: object) -> Iterator[Sandbox]:
    with Sandbox(tools=[two, named, none, typed], pool=1) as sandbox:
        yield sandbox


# The guest records what its stubs send (through `interpreter.tools`, which both paths call)
# and what the long path (`_encode_call`) makes of the same call. `_call_tool` raises while the
# stubs are called: a stub with scalar arguments must not take the long path.
_COMPARE = """
import interpreter as I
sent = []
class Recorder:
    def call(self, name, payload):
        sent.append(payload.decode())
        return b"0"
real_tools, real_long = I.tools, I._call_tool
def refused(*args):
    raise AssertionError("the long path was taken")
I.tools, I._call_tool = Recorder(), refused
try:
    two(a, b)
    named(a, k=b, o=a)
    none()
finally:
    I.tools, I._call_tool = real_tools, real_long
long = [
    I._encode_call("two", [a, b], {}).decode(),
    I._encode_call("named", [a], {"k": b, "o": a}).decode(),
    I._encode_call("none", [], {}).decode(),
]
result = [sent, long]
"""

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(scalars, scalars)
def test_the_scalar_path_sends_the_bytes_of_the_long_path(box: Sandbox, a: Any, b: Any) -> None:
    """A stub called with scalars sends exactly what ``_encode_call`` makes of the call."""
    result = box.run(_COMPARE, {"a": a, "b": b})
    assert result.ok, result.error
    sent, long = result.value
    assert sent == long


def test_scalar_calls_reach_the_tool(box: Sandbox) -> None:
    """Scalars of every kind, optional keywords given or not, a zero-argument tool."""
    code = (
        "result = [two(1, 'x'), two(True, None), two(1.5, 'é'), named(1, k='z'),"
        " named(2, k=3, o=4), none(), typed(5, 'q'), typed('6', 'q')]"
    )
    result = box.run(code)
    assert result.ok, result.error
    assert result.value == [
        [1, "x"],
        [True, None],
        [1.5, "é"],
        [1, "z", 1],
        [2, 3, 4],
        7,
        "5:q",
        "6:q",
    ]


_SAME_FAILURE = """
import interpreter as I
def outcome(fn, *args, **kwargs):
    try:
        return ["ok", fn(*args, **kwargs)]
    except BaseException as exc:
        return [type(exc).__name__, str(exc)]
values = [float("nan"), float("inf"), chr(0xD800), 10**5000, "x" * (1 << 20)]
result = [
    [outcome(two, v, 1), outcome(I._dispatch, "two", [v, 1], {})] for v in values
]
"""


def test_the_scalar_path_fails_as_the_long_path(box: Sandbox) -> None:
    """NaN, infinity, a lone surrogate, an unwritable integer, too many bytes: the same error
    as the long path, word for word."""
    result = box.run(_SAME_FAILURE)
    assert result.ok, result.error
    for fast, slow in result.value:
        assert fast == slow
        assert fast[0] != "ok"


_LOADS = """
import interpreter as I, json
def outcome(fn, data):
    try:
        return ["ok", repr(fn(data))]
    except BaseException as exc:
        return [type(exc).__name__, str(exc)]
cases = [b"1", b'"a"', b"[1,2]", b'{"a":null}', b" 1", b"1 ", b"", b"\\xff", b"[1", b"NaN",
         '"é"'.encode(), b"[]x"]
result = [[outcome(I._loads, c), outcome(json.loads, c)] for c in cases]
"""


def test_results_are_read_as_json_loads_reads_them(box: Sandbox) -> None:
    """The guest's reader of results (the C scanner first) agrees with ``json.loads``."""
    result = box.run(_LOADS)
    assert result.ok, result.error
    for fast, slow in result.value:
        assert fast == slow


@given(
    st.sampled_from([two, typed, named, none]),
    st.lists(st.integers() | st.text(max_size=3), max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "k", "o"]), st.integers(), max_size=2),
)
def test_arguments_are_what_bind_gives(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    """``Tool.arguments`` (validated in place for all-positional calls) gives ``bind``'s
    ``(args, kwargs)``, or the same kind of refusal."""
    tool = Tool(fn)
    refusal: BaseException | None = None
    try:
        bound = tool.bind(args, kwargs)
    except (TypeError, InvalidArgument) as exc:
        refusal = exc
    if refusal is not None:
        with pytest.raises(type(refusal), match=f"^{re.escape(str(refusal))}$"):
            tool.arguments(args, kwargs)
        return
    assert tool.arguments(args, kwargs) == (bound.args, bound.kwargs)


def lag(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_late_answer_is_not_the_next_calls(interpreter: object) -> None:
    """A timed-out call's thread still rings the pipe when it ends; the caller, then waiting
    for another call, is only woken by it, and gets that call's own result."""
    tools = [Tool(lag, timeout=0.1), Tool(slow, timeout=10)]
    with Sandbox(tools=tools, pool=0, limits=Limits(timeout=10)) as sandbox:
        code = (
            "kinds = []\ntry:\n    lag(0.3)\nexcept ToolError as e:\n    kinds.append(e.kind)\n"
            "result = [kinds, slow(0.6), slow(0.01)]"
        )
        result = sandbox.run(code)
    assert result.ok, result.error
    assert result.value == [["timeout"], 0.6, 0.01]


def _open_fds() -> int:
    """Open pipes of this process (instances being made or freed in the background hold other
    descriptors, which come and go while the count is taken)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("pipe:"):
                count += 1
        except OSError:  # closed meanwhile
            pass
    return count


def test_closed_sandboxes_leave_no_pipes(interpreter: object) -> None:
    """Each instance's pipe is closed with it; only the worker threads keep theirs (two
    descriptors per thread, and threads are kept). Counted: the process's pipes."""
    with Sandbox(tools=[two], pool=0) as sandbox:
        sandbox.run("two(1, 2)")  # the worker threads this needs exist from now on
    threads = _WORKERS.threads()
    before = _open_fds()
    for pool in (0, 2):
        with Sandbox(tools=[two], pool=pool) as sandbox:
            for _ in range(5):
                assert sandbox.run("two(1, 2)").ok
            session = sandbox.session()
            assert session.run("two(3, 4)").ok
            session.close()
    grown = _WORKERS.threads() - threads
    assert _open_fds() <= before + 2 * grown


def test_a_bell_wakes_its_sleeper_and_can_be_closed() -> None:
    """A ring wakes a sleeper at once (however long it sleeps), rings that came meanwhile are
    one wake-up, and a closed bell ignores rings (this process's bell: compiled or not;
    tests/sandbox/test_wake.py holds the two to each other)."""
    bell = _Bell()
    woke = threading.Event()

    def sleeper() -> None:
        assert bell.wait(0, 30_000_000_000)
        woke.set()

    thread = threading.Thread(target=sleeper)
    thread.start()
    bell.ring()
    thread.join(10)
    assert woke.is_set()
    for _ in range(100):
        bell.ring()
    assert bell.wait(0, 0)
    assert not bell.wait(0, 0)
    _WORKERS.close_bell(bell)
    bell.ring()
    bell.close()
    assert bell.closed
    assert not bell.wait(0, 0)


def test_calls_one_after_another_share_one_thread(interpreter: object) -> None:
    """A thread is started only for a call no idle thread can take: a run's calls one after
    another reuse one (a thread goes idle before it wakes its caller)."""
    with Sandbox(tools=[two], pool=0) as sandbox:
        assert sandbox.run("two(0, 0)").ok  # a thread exists from here on
        before = _WORKERS.threads()
        result = sandbox.run("result = [two(i, i)[0] for i in range(50)]")
        assert result.ok, result.error
        assert result.value == list(range(50))
        assert _WORKERS.threads() == before
