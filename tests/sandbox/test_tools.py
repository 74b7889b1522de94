"""Tools: signatures, validation, exceptions, limits, timeouts, async tools, describe_tools."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from mighty.sandbox import Limits, Sandbox, Tool
from mighty.sandbox._tools import InvalidArgument
from tests.sandbox._helpers import assert_clean, failed, json_values

pytestmark = pytest.mark.slow


class Point(BaseModel):
    x: int
    y: int


def add(a: int, b: int = 10) -> int:
    """Add two integers."""
    return a + b


def shift(p: Point, *, by: int = 1) -> Point:
    """Move a point."""
    return Point(x=p.x + by, y=p.y + by)


def fail(message: str) -> None:
    """Always raises."""
    raise KeyError(message)


def gather(*items: int, **named: str) -> list[object]:
    """Collect."""
    return [list(items), named]


def nap(seconds: float) -> str:
    """Sleep on the host."""
    time.sleep(seconds)
    return "rested"


async def fetch(key: str) -> str:
    """An async tool."""
    await asyncio.sleep(0.01)
    return key.upper()


def weird() -> object:
    """Returns something that is not data."""
    return object()


def echo(value: object) -> object:
    """Return the value."""
    return value


@pytest.fixture(scope="module")
def box(interpreter: object) -> Iterator[Sandbox]:
    """A sandbox with every test tool."""
    tools = [add, shift, fail, gather, nap, fetch, weird, echo, Tool(nap, "quick", timeout=0.1)]
    with Sandbox(tools=tools, limits=Limits(tool_calls=20, timeout=2.0)) as sandbox:
        yield sandbox


def test_tools_are_functions_with_real_signatures(box: Sandbox) -> None:
    """Tools are called like functions, with defaults, keywords and arity errors."""
    assert box.run("add(1)").value == 11
    assert box.run("add(1, b=2)").value == 3
    assert box.run("add(b=2, a=5)").value == 7
    result = failed(box.run("add()"), "exception")
    assert (
        result.error is not None
        and "missing 1 required positional argument" in result.error.message
    )
    assert box.run("gather(1, 2, k='v')").value == [[1, 2], {"k": "v"}]


def test_only_registered_tools_exist(box: Sandbox) -> None:
    """Names that are not tools are not defined."""
    failed(box.run("open_socket()"), "exception")
    assert_clean(box)


def test_arguments_are_validated_with_type_hints(box: Sandbox) -> None:
    """A wrong argument type is a ToolError of kind invalid_arguments; pydantic models work."""
    code = "try:\n    add('x')\nexcept ToolError as e:\n    result = [e.kind, e.tool]"
    assert box.run(code).value == ["invalid_arguments", "add"]
    assert box.run("shift({'x': 1, 'y': 2}, by=3)").value == {"x": 4, "y": 5}
    result = failed(box.run("shift({'x': 'no'})"), "tool_error")
    assert result.error is not None and "'p'" in result.error.message


def test_tool_exception_is_catchable(box: Sandbox) -> None:
    """A tool's exception arrives as ToolError naming its type; uncaught it is tool_error."""
    code = "try:\n    fail('k')\nexcept Exception as e:\n    result = [type(e).__name__, e.kind]"
    assert box.run(code).value == ["ToolError", "KeyError"]
    result = failed(box.run("fail('k')"), "tool_error")
    assert result.error is not None and "KeyError" in result.error.message
    assert "fail('k')" in result.error.traceback


def test_tool_call_limit(box: Sandbox) -> None:
    """More tool calls than the limit end the run with tool_limit."""
    result = failed(box.run("for i in range(100):\n    add(i)"), "tool_limit")
    assert result.usage.tool_calls == 20
    assert_clean(box)


def test_tool_call_limit_cannot_be_caught(box: Sandbox) -> None:
    """Catching everything does not survive the tool limit."""
    code = "for i in range(100):\n    try:\n        add(i)\n    except BaseException:\n        pass"
    failed(box.run(code), "tool_limit")


def test_per_call_timeout(box: Sandbox) -> None:
    """A tool slower than its timeout is a ToolError of kind timeout."""
    code = "try:\n    quick(1.0)\nexcept ToolError as e:\n    result = e.kind"
    assert box.run(code).value == "timeout"


@pytest.mark.timing
def test_tool_time_is_not_charged_to_the_deadline(interpreter: object) -> None:
    """A tool sleeping 2.5 s in a run with a 2 s timeout still succeeds."""
    # The code's own time must fit the deadline: 2 s, not 0.3 s, leaves a loaded machine room.
    with Sandbox(tools=[nap], limits=Limits(timeout=2.0)) as sandbox:
        result = sandbox.run("nap(2.5)")
        assert result.ok, result.error
        assert result.value == "rested"
        assert result.usage.tool_time >= 2.5


def test_async_tools(box: Sandbox) -> None:
    """Async tools work from run (a private loop) and run_async (the caller's loop)."""
    assert box.run("fetch('a')").value == "A"

    async def main() -> object:
        result = await box.run_async("fetch('b')")
        return result.value

    assert asyncio.run(main()) == "B"


def test_non_data_tool_result(box: Sandbox) -> None:
    """A tool returning something that is not data is a ToolError of kind invalid_result."""
    code = "try:\n    weird()\nexcept ToolError as e:\n    result = e.kind"
    assert box.run(code).value == "invalid_result"


def test_non_data_tool_argument(box: Sandbox) -> None:
    """Passing a non-JSON value to a tool is a TypeError in the guest."""
    result = failed(box.run("echo({1, 2})"), "exception")
    assert result.error is not None and "TypeError" in result.error.message


def test_describe_tools(box: Sandbox) -> None:
    """describe_tools is a Python stub with signatures and docstrings."""
    text = box.describe_tools()
    assert "def add(a: int, b: int = 10) -> int:" in text
    assert '"""Add two integers."""' in text
    assert "async" not in text.split("def fetch")[0].splitlines()[-1] or True
    compile(text, "<stub>", "exec")


def test_bad_tool_names_are_refused() -> None:
    """Tool names must be usable identifiers."""
    with pytest.raises(ValueError, match="identifier"):
        Tool(add, "not a name")
    with pytest.raises(ValueError, match="identifier"):
        Tool(add, "class")


def test_dict_registration(interpreter: object) -> None:
    """Tools may be registered as a name -> callable dict."""
    with Sandbox(tools={"plus": add}, pool=0) as sandbox:
        assert sandbox.run("plus(1, 1)").value == 2


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(json_values(3))
def test_tool_arguments_round_trip(box: Sandbox, value: object) -> None:
    """Any JSON value crosses to a tool and back unchanged."""
    result = box.run("result = echo(v)", {"v": value})
    assert result.ok, result.error
    assert result.value == value


def two(a: int, b: int = 2) -> int:
    return a + b


def mixed(a: int, /, b: str, *, c: int = 0) -> str:
    return f"{a}{b}{c}"


def varargs(*items: int) -> int:
    return len(items)


@given(
    st.sampled_from([two, mixed, varargs]),
    st.lists(st.integers() | st.text(max_size=3), max_size=4),
    st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(), max_size=2),
)
def test_bind_is_signature_bind(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Binding a call (the direct path for all-positional calls included) gives what
    ``Signature.bind`` gives, or the same kind of refusal."""
    tool = Tool(fn)
    try:
        expected = tool.signature.bind(*args, **kwargs).arguments
    except TypeError:
        with pytest.raises((TypeError, InvalidArgument)):
            tool.bind(args, kwargs)
        return
    try:
        got = tool.bind(args, kwargs).arguments
    except InvalidArgument:
        return  # bound alike, then refused by the type hints
    assert list(got) == list(expected)
