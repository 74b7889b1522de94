"""Hostile code: every case ends with the right error kind, the host unharmed, the next run clean."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from mighty.sandbox import Limits, Sandbox
from tests.sandbox._helpers import assert_clean, failed

pytestmark = pytest.mark.slow


def echo(value: object) -> object:
    """Return the value."""
    return value


BOX_FUEL = 3_000_000_000
"""The box's fuel: about 0.3 s of pure Python on a quiet machine."""
BOX_TIMEOUT = 60.0
"""The box's deadline, far past its fuel: what these tests pin is the error kind, never how fast
the machine is (a 1 s deadline ended a 0.1 s recursion as deadline_exceeded under load)."""
UNBOUNDED_FUEL = 10**15
"""Fuel for tests whose subject is the deadline: hours of work, so the deadline always wins."""


@pytest.fixture(scope="module")
def box(interpreter: object) -> Iterator[Sandbox]:
    """A sandbox with a small fuel budget, a deadline far past it, and one tool."""
    with Sandbox(tools=[echo], limits=Limits(timeout=BOX_TIMEOUT, fuel=BOX_FUEL)) as sandbox:
        yield sandbox


@pytest.mark.timing
def test_endless_loop(box: Sandbox) -> None:
    """`while True: pass` ends with out_of_fuel or its deadline, whichever comes first."""
    result = box.run("while True: pass")
    assert result.error is not None
    assert result.error.kind in ("out_of_fuel", "deadline_exceeded")
    assert result.usage.fuel <= BOX_FUEL  # it ends within its budget, on any machine
    assert_clean(box)


@pytest.mark.timing
def test_endless_loop_hits_the_deadline(interpreter: object) -> None:
    """With plenty of fuel, an endless loop ends at its deadline."""
    with Sandbox(limits=Limits(timeout=0.3, fuel=UNBOUNDED_FUEL)) as sandbox:
        failed(sandbox.run("while True: pass"), "deadline_exceeded")
        assert_clean(sandbox)


def test_endless_loop_runs_out_of_fuel(interpreter: object) -> None:
    """With little fuel, an endless loop ends with out_of_fuel."""
    with Sandbox(limits=Limits(fuel=50_000_000, timeout=BOX_TIMEOUT)) as sandbox:
        result = failed(sandbox.run("while True: pass"), "out_of_fuel")
        assert result.usage.fuel == 50_000_000
        assert_clean(sandbox)


@pytest.mark.timing
def test_catching_everything_does_not_survive_the_timeout(interpreter: object) -> None:
    """Code that catches every exception still stops at its deadline."""
    code = (
        "while True:\n    try:\n        while True: pass\n    except BaseException:\n        pass"
    )
    with Sandbox(limits=Limits(timeout=0.3, fuel=UNBOUNDED_FUEL)) as sandbox:
        failed(sandbox.run(code), "deadline_exceeded")
        assert_clean(sandbox)


def test_string_bomb(box: Sandbox) -> None:
    """`'a' * 10**10` is out_of_memory (it cannot fit in wasm32 at all)."""
    failed(box.run("'a' * 10**10"), "out_of_memory")
    assert_clean(box)


def test_string_bomb_that_fits_the_address_space(box: Sandbox) -> None:
    """`'a' * 10**9` is out_of_memory: the grow past the ceiling is refused."""
    failed(box.run("x = 'a' * 10**9"), "out_of_memory")
    assert_clean(box)


def test_list_bomb(box: Sandbox) -> None:
    """`list(range(10**10))` is out_of_memory."""
    failed(box.run("list(range(10**10))"), "out_of_memory")
    assert_clean(box)


def test_list_bomb_that_fits_the_address_space(box: Sandbox) -> None:
    """`list(range(10**8))` is out_of_memory."""
    failed(box.run("x = list(range(10**8))"), "out_of_memory")
    assert_clean(box)


def test_nested_growth(box: Sandbox) -> None:
    """Memory grown step by step in nested structures ends with out_of_memory."""
    code = "x = []\nwhile True:\n    x = [x, bytearray(10**6), [0] * 10**5]"
    failed(box.run(code), "out_of_memory")
    assert_clean(box)


def test_memory_error_caught_by_the_code_still_ends_the_run(box: Sandbox) -> None:
    """Catching MemoryError does not get around the ceiling."""
    code = "try:\n    x = bytearray(10**9)\nexcept MemoryError:\n    pass\nresult = 1"
    failed(box.run(code), "out_of_memory")
    assert_clean(box)


@pytest.mark.timing
def test_deep_recursion(box: Sandbox) -> None:
    """Unbounded recursion is a RecursionError, reported as an exception with user frames."""
    result = failed(box.run("def f(n):\n    return f(n + 1)\nf(0)"), "exception")
    assert result.error is not None
    assert "RecursionError" in result.error.message
    assert '<sandbox>", line 2, in f' in result.error.traceback
    assert_clean(box)


@pytest.mark.timing
def test_deep_recursion_with_the_limit_raised(box: Sandbox) -> None:
    """Raising the recursion limit turns the recursion into a memory bomb: out_of_memory."""
    code = "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)"
    result = box.run(code)
    assert result.error is not None
    assert result.error.kind in ("out_of_memory", "exception", "deadline_exceeded")
    assert_clean(box)


@pytest.mark.timing
def test_output_flood_stops_at_the_limit(interpreter: object) -> None:
    """`while True: print('x' * 10000)` ends at once with output_limit, output kept to the cap."""
    with Sandbox(limits=Limits(output=100_000, timeout=BOX_TIMEOUT)) as sandbox:
        result = failed(sandbox.run("while True: print('x' * 10000)"), "output_limit")
        # At once: after a sliver of its fuel (~7.4 million of 10**10), counted, not timed.
        assert result.usage.fuel < sandbox.limits.fuel // 100
        assert len(result.stdout) == 100_000
        assert_clean(sandbox)


def test_stderr_flood_stops_at_the_limit(interpreter: object) -> None:
    """A flood on stderr is stopped the same way."""
    with Sandbox(limits=Limits(output=50_000, timeout=BOX_TIMEOUT)) as sandbox:
        code = "import sys\nwhile True: sys.stderr.write('y' * 1000)"
        result = failed(sandbox.run(code), "output_limit")
        assert len(result.stderr) == 50_000
        assert_clean(sandbox)


def test_sys_exit(box: Sandbox) -> None:
    """`sys.exit()` is an exception saying the code called exit."""
    result = failed(box.run("import sys\nsys.exit(3)"), "exception")
    assert result.error is not None
    assert "exit(3)" in result.error.message
    assert_clean(box)


def test_os_exit(box: Sandbox) -> None:
    """`os._exit()` ends the interpreter: an exception saying so."""
    result = failed(box.run("import os\nos._exit(0)"), "exception")
    assert result.error is not None
    assert "os._exit" in result.error.message
    assert_clean(box)


def test_reading_etc_passwd(box: Sandbox) -> None:
    """No file is visible: /etc/passwd does not exist for the code."""
    result = failed(box.run("open('/etc/passwd').read()"), "exception")
    assert result.error is not None
    assert "FileNotFoundError" in result.error.message
    assert_clean(box)


def test_proc_self(box: Sandbox) -> None:
    """/proc/self does not exist for the code either."""
    result = failed(box.run("import os\nos.listdir('/proc/self')"), "exception")
    assert result.error is not None
    assert "FileNotFoundError" in result.error.message
    assert_clean(box)


def test_environment_is_empty(box: Sandbox) -> None:
    """The code sees no environment variables, whatever the host has."""
    os.environ.setdefault("MIGHTY_SECRET_FOR_TEST", "s3cret")
    result = box.run("import os\nresult = dict(os.environ)")
    assert result.ok
    assert result.value == {}
    assert_clean(box)


def test_network_has_no_socket_module(box: Sandbox) -> None:
    """There is no socket module: network code fails to import."""
    result = failed(box.run("import socket"), "exception")
    assert result.error is not None
    assert "ModuleNotFoundError" in result.error.message
    assert_clean(box)


def test_network_through_urllib(box: Sandbox) -> None:
    """High-level network code fails too, as an exception."""
    code = "import urllib.request\nurllib.request.urlopen('http://example.com')"
    failed(box.run(code), "exception")
    assert_clean(box)


def test_subclasses_walk_reaches_nothing_outside(box: Sandbox) -> None:
    """`__subclasses__` only finds the interpreter's own classes; nothing escapes."""
    code = (
        "names = [c.__name__ for c in ().__class__.__base__.__subclasses__()]\n"
        "result = [n for n in names if n in ('Popen', 'socket', 'CDLL')]"
    )
    result = box.run(code)
    assert result.ok, result.error
    assert result.value == []
    assert_clean(box)


def test_sys_modules_tampering_does_not_leak(box: Sandbox) -> None:
    """Patching sys.modules and the interpreter itself affects only that run."""
    code = (
        "import sys, json\n"
        "json.dumps = lambda *a, **k: 'pwned'\n"
        "sys.modules['math'] = None\n"
        "sys.modules['interpreter']._dumps = lambda v, w: b'\"pwned\"'\n"
        "result = 1"
    )
    box.run(code)
    result = box.run("import math, json\nresult = json.dumps(math.pi)")
    assert result.ok
    assert result.value == "3.141592653589793"
    assert_clean(box)


def test_builtins_tampering_does_not_leak(box: Sandbox) -> None:
    """Replacing builtins affects only that run."""
    box.run("import builtins\nbuiltins.len = lambda x: 42\n__builtins__.print = None")
    result = box.run("result = len([1, 2])")
    assert result.value == 2
    assert_clean(box)


def test_forged_code_object_crashes_only_the_interpreter(box: Sandbox) -> None:
    """A forged code object may crash CPython in wasm: an exception, the host unharmed."""
    code = (
        "f = lambda: 0\n"
        "f.__code__ = f.__code__.replace(co_code=b'\\x97\\x00' + b'\\x64\\xff' * 50, co_consts=())\n"
        "f()"
    )
    result = box.run(code)
    assert not result.ok
    assert result.error is not None
    assert result.error.kind in ("exception", "out_of_memory", "out_of_fuel")
    assert_clean(box)


def test_ctypes_is_absent(box: Sandbox) -> None:
    """There is no ctypes in the interpreter."""
    result = failed(box.run("import ctypes"), "exception")
    assert result.error is not None
    assert "ctypes" in result.error.message
    assert_clean(box)


def test_raw_import_with_unknown_tool_is_not_allowed(box: Sandbox) -> None:
    """Calling the tools interface directly with an unregistered name ends with not_allowed."""
    code = "from wit_world.imports import tools\ntools.call('os_system', b'{}')"
    failed(box.run(code), "not_allowed")
    assert_clean(box)


def test_raw_import_with_garbage_arguments(box: Sandbox) -> None:
    """Garbage bytes to a real tool are refused as invalid arguments (a tool_error)."""
    code = "from wit_world.imports import tools\ntools.call('echo', b'\\xff{not json')"
    result = box.run(code)
    assert result.error is not None
    assert result.error.kind == "exception"  # the raw import raises componentize-py's Err
    assert_clean(box)


def test_tool_with_huge_arguments(box: Sandbox) -> None:
    """Arguments over the size limit are refused; the code sees a ToolError."""
    code = "try:\n    echo('x' * (2 << 20))\nexcept ToolError as e:\n    result = e.kind"
    result = box.run(code)
    assert result.ok, result.error
    assert result.value == "too_large"
    assert_clean(box)


def test_tool_with_deeply_nested_arguments(box: Sandbox) -> None:
    """Deeply nested arguments are refused before they reach the tool."""
    code = (
        "x = []\nfor _ in range(150):\n    x = [x]\n"
        "try:\n    echo(x)\nexcept ToolError as e:\n    result = e.kind"
    )
    result = box.run(code)
    assert result.ok, result.error
    assert result.value == "invalid_arguments"
    assert_clean(box)


def test_tool_with_nesting_too_deep_for_json(box: Sandbox) -> None:
    """Nesting the guest cannot even encode is an exception in the guest."""
    code = "x = []\nfor _ in range(10000):\n    x = [x]\necho(x)"
    failed(box.run(code), "exception")
    assert_clean(box)


def test_result_not_json(box: Sandbox) -> None:
    """A result that is not JSON-compatible is an exception naming the offending part."""
    result = failed(box.run("result = {'a': [1, {2, 3}]}"), "exception")
    assert result.error is not None
    assert "result['a'][1] is a set" in result.error.message
    assert_clean(box)


def test_result_self_referential(box: Sandbox) -> None:
    """A self-referential result is an exception (a circular reference)."""
    result = failed(box.run("x = {}\nx['x'] = x\nresult = x"), "exception")
    assert result.error is not None
    assert "circular" in result.error.message
    assert_clean(box)


def test_result_huge(interpreter: object) -> None:
    """A result over the output limit is output_limit."""
    with Sandbox(limits=Limits(output=10_000)) as sandbox:
        failed(sandbox.run("result = 'x' * 20_000"), "output_limit")
        assert_clean(sandbox)


def test_result_nan(box: Sandbox) -> None:
    """NaN is not JSON."""
    failed(box.run("result = float('nan')"), "exception")
    assert_clean(box)


def test_values_from_one_run_are_not_in_the_next(box: Sandbox) -> None:
    """Globals, module attributes, builtins and files written in one run are gone in the next."""
    box.run(
        "secret = 'abc'\nimport math\nmath.secret = 'abc'\nimport builtins\n"
        "builtins.secret = 'abc'\nimport sys\nsys.secret = 'abc'"
    )
    code = (
        "import math, sys, builtins\n"
        "result = [name for name, where in (('g', globals()), ('m', vars(math)),"
        " ('b', vars(builtins)), ('s', vars(sys))) if 'secret' in where]"
    )
    result = box.run(code)
    assert result.ok, result.error
    assert result.value == []
    assert_clean(box)


def test_tool_with_large_arguments_under_the_limit(box: Sandbox) -> None:
    """Arguments just under the size limit reach the tool and come back."""
    result = box.run("result = len(echo('x' * 1_000_000))")
    assert result.ok, result.error
    assert result.value == 1_000_000
    assert_clean(box)
