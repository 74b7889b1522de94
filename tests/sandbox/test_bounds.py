"""Hostile input stays bounded: results, error texts, tool failures, nesting and threads."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.sandbox import Limits, Sandbox
from mighty.sandbox._data import NotData, cut_text, encode_json, json_problem
from mighty.sandbox._results import MAX_ERROR_TEXT, check_result
from mighty.sandbox._tools import (
    _WORKERS,
    MAX_DATA,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_TOOL_THREADS,
)
from tests.sandbox._helpers import assert_clean, failed, json_values

NOTE = 60  # the "[... cut: N characters in all]" note, with room for N


# -- pure codecs and checks (no wasm) ------------------------------------------------------


@given(json_values(4))
def test_json_data_passes_the_check(value: Any) -> None:
    """Every JSON value is JSON data, and its bytes decode back to it."""
    assert json_problem(value) is None
    assert check_result(json.dumps(value).encode()) == (value,)


@given(json_values(3), st.sampled_from(["\ud800", "a\udfffb", math.inf, -math.inf, math.nan]))
def test_bad_leaves_fail_the_check(value: Any, bad: Any) -> None:
    """A lone surrogate or a non-finite float anywhere (value or key) is not JSON data."""
    for planted in ([value, bad], {"k": [bad]}):
        assert json_problem(planted) is not None
    if isinstance(bad, str):
        assert json_problem({bad: 1}) is not None


def test_result_bytes_are_strict() -> None:
    """Encoded surrogates, escaped surrogates, 1e999 and bad UTF-8 are refused as results."""
    for data in (b'"\xed\xa0\x80"', b'"\\ud800"', b"[1e999,-1e999]", b'"\xff"', b"NaN"):
        error = check_result(data)
        assert not isinstance(error, tuple), data
        assert error.kind == "exception"
        assert error.message.startswith("TypeError: ")


@given(json_values(4))
def test_encode_json_matches_json_dumps(value: Any) -> None:
    """The bounded encoder writes what json.dumps would, decoding to the same value."""
    assert json.loads(encode_json(value, MAX_DATA)) == value


@given(json_values(4), st.integers(min_value=0, max_value=200))
def test_encode_json_never_passes_its_limit(value: Any, limit: int) -> None:
    """The encoder returns at most `limit` bytes or says the value is too large."""
    size = len(json.dumps(value, ensure_ascii=True, separators=(",", ":")))
    if size > limit:
        with pytest.raises(NotData) as caught:
            encode_json(value, limit)
        assert caught.value.too_large
    else:
        assert len(encode_json(value, limit)) == size


def test_encode_json_refuses_lazy_and_strange_values() -> None:
    """Generators, iterators, coroutines, surrogates, NaN and non-string keys are refused."""

    def endless() -> Iterator[int]:
        while True:
            yield 1

    async def later() -> int:
        return 1

    coroutine = later()
    for value in (endless(), [1, iter([2])], {"a": map(str, [1])}, coroutine, "\ud800", math.nan):
        with pytest.raises(NotData) as caught:
            encode_json(value, MAX_DATA)
        assert not caught.value.too_large
    coroutine.close()
    with pytest.raises(NotData):
        encode_json({(1, 2): 3}, MAX_DATA)
    assert encode_json({1: {2, 3}, None: (1,)}, MAX_DATA) == b'{"1":[2,3],"null":[1]}'


def test_encode_json_cuts_a_huge_string_by_length() -> None:
    """A string longer than the limit is refused before anything is encoded."""
    with pytest.raises(NotData) as caught:
        encode_json("x" * (MAX_DATA * 50), MAX_DATA)
    assert caught.value.too_large


@given(st.text(), st.integers(min_value=0, max_value=300))
def test_cut_text_is_bounded_valid_and_a_prefix(text: str, limit: int) -> None:
    """cut_text gives valid UTF-8 of at most limit bytes plus a note, starting like the text."""
    planted = text[: len(text) // 2] + "\ud800" + text[len(text) // 2 :]
    for item in (text, planted):
        cut = cut_text(item, limit)
        data = cut.encode("utf-8")  # strict: no surrogates left
        assert len(data) <= max(limit, NOTE)
        if len(item.encode("utf-8", "replace")) <= limit:
            assert cut == item.encode("utf-8", "replace").decode()
        else:
            assert f"cut: {len(item)} characters in all" in cut


def test_cut_text_of_a_huge_text_is_cheap() -> None:
    """Cutting a 50-million-character text states its length and keeps only the head."""
    cut = cut_text("\x01" * 50_000_000, 100)
    assert len(cut) <= NOTE + 100
    assert "50000000 characters" in cut


# -- through the sandbox -------------------------------------------------------------------

RELEASE = threading.Event()


def echo(value: object) -> object:
    """Return the value."""
    return value


def ints(xs: list[int]) -> int:
    """Count integers."""
    return len(xs)


def endless() -> object:
    """An endless generator."""

    def gen() -> Iterator[str]:
        while True:
            yield "x" * 100

    return gen()


def huge() -> list[str]:
    """More than MAX_DATA bytes of JSON."""
    return ["y" * 1000] * 5000


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def raises(what: str) -> None:
    """Raise something nasty."""
    kinds: dict[str, BaseException] = {
        "exit": SystemExit(3),
        "interrupt": KeyboardInterrupt(),
        "generator": GeneratorExit(),
        "badstr": BadStr(),
        "long": ValueError("z" * 10_000_000),
    }
    raise kinds[what]


async def araises(what: str) -> None:
    """Raise something nasty from a coroutine."""
    raises(what)


def stuck() -> None:
    """Hang until the test releases it."""
    RELEASE.wait(60)


_BOX: list[Sandbox] = []


def nest(code: str) -> object:
    """Run code in the same sandbox, from inside a tool."""
    return _BOX[0].run(code).to_json()


@pytest.fixture(scope="module")
def box(interpreter: object) -> Iterator[Sandbox]:
    """A sandbox with every hostile tool."""
    tools: list[Callable[..., Any]] = [echo, ints, endless, huge, raises, araises, stuck, nest]
    limits = Limits(timeout=5.0, tool_timeout=5.0, memory=256 << 20)
    with Sandbox(tools=tools, limits=limits) as sandbox:
        _BOX[:] = [sandbox]
        yield sandbox
        _BOX.clear()


@pytest.mark.slow
@pytest.mark.parametrize(
    "code",
    [
        "import interpreter\ninterpreter._dumps = lambda v, w: b'\"\\\\ud800\"'\nresult = 1",
        "import interpreter\ninterpreter._dumps = lambda v, w: b'\"\\xed\\xa0\\x80\"'\nresult = 1",
        "import interpreter\ninterpreter._dumps = lambda v, w: b'[1e999, -1e999]'\nresult = 1",
        "import interpreter\ninterpreter._dumps = lambda v, w: b'{\"\\\\udfff\": 1}'\nresult = 1",
    ],
)
def test_patched_result_encoder_cannot_pass_non_data(box: Sandbox, code: str) -> None:
    """A result the patched encoder forged (lone surrogate, infinity) is an exception."""
    result = failed(box.run(code), "exception")
    assert result.error is not None and result.error.message.startswith("TypeError: ")
    json.dumps(result.to_json(), allow_nan=False).encode("utf-8")  # printable as strict JSON
    assert_clean(box)


@pytest.mark.slow
def test_huge_tool_name_is_refused_by_length(box: Sandbox) -> None:
    """A 5-million-character tool name is not_allowed, with a message of a hundred bytes."""
    code = "from wit_world.imports import tools\ntools.call('\\x01' * 5_000_000, b'{}')"
    result = failed(box.run(code), "not_allowed")
    assert result.error is not None
    assert len(result.error.message) < 200
    assert "5000000 characters" in result.error.message
    assert str(MAX_NAME) in result.error.message
    assert_clean(box)


@pytest.mark.slow
def test_unknown_short_name_is_still_named(box: Sandbox) -> None:
    """An unknown name under the bound is shown in the not_allowed message."""
    code = "from wit_world.imports import tools\ntools.call('os_system', b'{}')"
    result = failed(box.run(code), "not_allowed")
    assert result.error is not None and "'os_system'" in result.error.message


@pytest.mark.slow
def test_guest_error_texts_are_cut(box: Sandbox) -> None:
    """A 3 MB exception message (and traceback) comes back as MAX_ERROR_TEXT bytes each."""
    result = failed(box.run("raise Exception('m' * 3_000_000)"), "exception")
    assert result.error is not None
    assert len(result.error.message.encode()) <= MAX_ERROR_TEXT
    assert len(result.error.traceback.encode()) <= MAX_ERROR_TEXT
    assert "3000011 characters in all" in result.error.message
    assert_clean(box)


@pytest.mark.slow
def test_guest_error_texts_fit_a_small_output_limit(interpreter: object) -> None:
    """With a 10 kB output limit, message and traceback together stay under it."""
    with Sandbox(limits=Limits(output=10_000), pool=0) as sandbox:
        result = failed(sandbox.run("raise Exception('m' * 100_000)"), "exception")
        assert result.error is not None
        assert len(result.error.message.encode()) + len(result.error.traceback.encode()) <= 10_000
        assert_clean(sandbox)


@pytest.mark.slow
def test_many_validation_errors_are_summarised(box: Sandbox) -> None:
    """200,000 bad list items give a one-line count, not 20 MB of errors."""
    code = (
        "try:\n    ints(['a'] * 200_000)\nexcept ToolError as e:\n    result = [e.kind, e.message]"
    )
    result = box.run(code)
    assert result.ok, result.error
    kind, message = result.value
    assert kind == "invalid_arguments"
    assert len(message) < 500
    assert "200000" in message
    assert_clean(box)


@pytest.mark.slow
def test_a_few_validation_errors_are_listed(box: Sandbox) -> None:
    """Up to five errors are listed, the rest counted."""
    code = "try:\n    ints(['a'] * 8)\nexcept ToolError as e:\n    result = e.message"
    result = box.run(code)
    assert result.ok, result.error
    assert result.value.count("valid integer") == 5
    assert "and 3 more errors" in result.value


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["raises", "araises"])
@pytest.mark.parametrize(
    ("what", "kind"),
    [
        ("exit", "SystemExit"),
        ("interrupt", "KeyboardInterrupt"),
        ("generator", "GeneratorExit"),
        ("badstr", "BadStr"),
    ],
)
def test_any_tool_exception_is_a_tool_error(box: Sandbox, tool: str, what: str, kind: str) -> None:
    """SystemExit, KeyboardInterrupt, GeneratorExit, a failing __str__: a ToolError."""
    code = f"try:\n    {tool}({what!r})\nexcept ToolError as e:\n    result = [e.kind, e.message]"
    result = box.run(code)
    assert result.ok, result.error
    assert result.value[0] == kind
    failed(box.run(f"{tool}({what!r})"), "tool_error")
    assert_clean(box)


@pytest.mark.slow
def test_tool_exceptions_from_run_async(box: Sandbox) -> None:
    """Under run_async (the caller's loop, off the main thread here) the same holds."""

    def scenario() -> object:
        async def main() -> object:
            code = "try:\n    araises('interrupt')\nexcept ToolError as e:\n    result = e.kind"
            return (await box.run_async(code)).value

        return asyncio.run(main())

    out: list[object] = []
    worker = threading.Thread(target=lambda: out.append(scenario()))
    worker.start()
    worker.join(30)
    assert out == ["KeyboardInterrupt"]


@pytest.mark.slow
def test_long_tool_message_is_cut(box: Sandbox) -> None:
    """A 10 MB exception message from a tool reaches the code cut to MAX_MESSAGE."""
    code = "try:\n    raises('long')\nexcept ToolError as e:\n    result = e.message"
    result = box.run(code)
    assert result.ok, result.error
    assert len(result.value.encode()) <= MAX_MESSAGE
    assert "10000000 characters" in result.value


@pytest.mark.slow
def test_endless_generator_is_refused(box: Sandbox) -> None:
    """A tool returning an endless generator is invalid_result at once, never drained."""
    code = "try:\n    endless()\nexcept ToolError as e:\n    result = [e.kind, e.message]"
    result = box.run(code)
    assert result.ok, result.error
    assert result.value[0] == "invalid_result"
    assert "generator" in result.value[1]
    assert_clean(box)


@pytest.mark.slow
def test_huge_tool_result_is_too_large(box: Sandbox) -> None:
    """A result past MAX_DATA stops encoding at the limit: too_large."""
    code = "try:\n    huge()\nexcept ToolError as e:\n    result = e.kind"
    assert box.run(code).value == "too_large"


@pytest.mark.slow
def test_nested_runs_are_capped(box: Sandbox) -> None:
    """A tool may run code once nested; the inner run's tool may not nest again."""
    result = box.run("nest('nest(\"1 + 1\")')")
    assert result.ok, result.error
    inner = result.value
    assert inner["ok"] is False
    assert inner["error"]["kind"] == "tool_error"
    assert "at most 1 level" in inner["error"]["message"]
    assert box.run("nest('1 + 1')").value["value"] == 2
    assert_clean(box)


@pytest.mark.slow
def test_hung_sync_tools_are_bounded(interpreter: object) -> None:
    """Hung tools use at most MAX_TOOL_THREADS threads; then a call fails fast with busy."""
    RELEASE.clear()
    before = threading.active_count()
    code = (
        "kinds = []\nfor i in range(60):\n    try:\n        stuck()\n"
        "    except ToolError as e:\n        kinds.append(e.kind)\nresult = kinds"
    )
    limits = Limits(tool_timeout=0.05, tool_calls=100, timeout=30)
    try:
        with Sandbox(tools=[stuck], limits=limits, pool=0) as sandbox:
            result = sandbox.run(code)
            assert result.ok, result.error
            kinds = result.value
            assert set(kinds) == {"timeout", "busy"}
            assert kinds.count("timeout") <= MAX_TOOL_THREADS
            assert kinds[-1] == "busy"
            assert threading.active_count() - before <= MAX_TOOL_THREADS
            assert _WORKERS.threads() <= MAX_TOOL_THREADS
    finally:
        RELEASE.set()
    with Sandbox(tools=[echo], pool=0) as sandbox:
        for _ in range(100):  # the released threads serve new calls again
            if _WORKERS.stuck() == 0:
                break
            threading.Event().wait(0.05)
        assert sandbox.run("echo(5)").value == 5


_CTRL_C = """
import os, signal, threading, time
from mighty._errors import Cancelled
from mighty.sandbox import Limits, Sandbox

def stuck() -> None:
    # The signal comes once the tool is running, however slow the machine is to get there.
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    time.sleep(60)

with Sandbox(tools=[stuck], limits=Limits(tool_timeout=60), pool=0) as box:
    try:
        box.run("stuck()")
    except Cancelled as exc:
        print("cancelled", exc.reason, exc.signal == signal.SIGINT)
    else:
        print("not cancelled")
"""


@pytest.mark.slow
def test_ctrl_c_while_a_tool_hangs_stops_the_host(interpreter: object) -> None:
    """A real SIGINT during a 60 s tool call ends the run as Cancelled, long before the tool."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.stdout.strip() == "cancelled interrupted True", done.stderr
