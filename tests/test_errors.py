"""One error family per cause: every public exception is a GuestError or a HostError, not both.

Guest-caused (the guest trapped, ran out of a budget, its handler failed, its circuit opened)
under ``GuestError``; host-caused (bad input, a missing file, a refused request) under
``HostError``. The few that are neither are listed with the reason.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil

import pytest

import mighty
from mighty import BadInput, Closed, GuestError, HostError, MightyError, Misuse, WrongType
from mighty.agents import (
    AgentCrashed,
    AgentError,
    AskTimeout,
    CircuitBreaker,
    CircuitOpen,
    CircuitOpenError,
    HandlerFailed,
    NoProc,
    Refused,
)
from tests.test_layers import _modules, _tree  # the same walk as the layering test

NEITHER = {
    "mighty.MightyError": "the root of both families",
    "mighty.agents.AgentError": "groups the WIT agent-error cases; each case is in one family",
    "mighty.gate.GuestViolation": "a host function's signal; the gate turns it into a GuestTrap",
    "mighty.gate.GuestExitRequest": "wasi:cli/exit's signal; the call ends in GuestExit",
    "mighty.trace.ReplayAborted": "raised by a replay observer to stop the replay on purpose",
}

# Bare builtins still raised, each inside the host where the caller never sees it: decoders
# whose ValueError is caught at their boundary (and becomes TraceCorrupt or SchemaError),
# pydantic validators (pydantic wants ValueError and reports BadInput), json constant hooks,
# invariant checks inside WASI host functions (the gate reports HostFunctionFailed), and the
# pure-Python bell's argument checks (sandbox._tools._PipeBell.wait: the same ValueError and
# TypeError the compiled mighty.sandbox._wake.Bell raises, which the tests hold it to; only the
# tool pool calls it, with arguments it made).
INTERNAL_RAISES = {
    ("mighty.agents._manifest", "_size"),
    ("mighty.cluster._config", "_names"),
    ("mighty.cluster._config", "_peers"),
    ("mighty.cluster._config", "_servers"),
    ("mighty.reload._schema", "_reject_constant"),
    ("mighty.sandbox._results", "_not_json"),
    ("mighty.sandbox._tools", "_no_constants"),
    ("mighty.sandbox._tools", "wait"),
    ("mighty.trace._format", "_blob_hook"),
    ("mighty.trace._format", "_no_blobs"),
    ("mighty.trace._values", "_array"),
    ("mighty.trace._values", "_check_hashed"),
    ("mighty.trace._values", "_decode"),
    ("mighty.trace._values", "value_from_tag"),
    ("mighty.wasi._io", "_read_bounded"),
    ("mighty.wasi._io", "_write_all"),
}


def _public_modules() -> list[str]:
    names = ["mighty"]
    for info in pkgutil.walk_packages(mighty.__path__, "mighty."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    return names


def _exported_exceptions() -> dict[type[BaseException], str]:
    found: dict[type[BaseException], str] = {}
    for name in _public_modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional extra that is not installed
            continue
        for item in getattr(module, "__all__", ()):
            value = getattr(module, item)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.setdefault(value, f"{name}.{item}")
    return found


def test_every_public_exception_is_in_exactly_one_family() -> None:
    """Each exported exception class is under GuestError or HostError, never both."""
    exceptions = _exported_exceptions()
    assert len(exceptions) > 50  # the walk sees the packages
    wrong = []
    for cls, where in exceptions.items():
        families = [f for f in (GuestError, HostError) if issubclass(cls, f)]
        if where in NEITHER or cls in (GuestError, HostError):
            if where in NEITHER:
                assert not families, f"{where} is listed as neither but is {families}"
            continue
        if len(families) != 1:
            wrong.append(f"{where}: {[f.__name__ for f in families]}")
    assert wrong == []
    assert {exceptions[c] for c in exceptions if exceptions[c] in NEITHER} == set(NEITHER)


@pytest.mark.parametrize(
    ("cls", "family"),
    [
        (AgentCrashed, GuestError),
        (HandlerFailed, GuestError),
        (CircuitOpen, GuestError),
        (NoProc, HostError),
        (Refused, HostError),
        (AskTimeout, HostError),
    ],
)
def test_agent_errors_sit_by_cause(cls: type[AgentError], family: type[MightyError]) -> None:
    """The agent errors a sender sees are AgentErrors, each in the family of its cause."""
    assert issubclass(cls, AgentError)
    assert issubclass(cls, family)
    other = HostError if family is GuestError else GuestError
    assert not issubclass(cls, other)


def test_one_circuit_open() -> None:
    """A breaker's check and an open circuit on a send raise the same class, with its code."""
    assert CircuitOpenError is CircuitOpen
    breaker = CircuitBreaker("svc", failure_threshold=1, window=10.0, cooldown=5.0)
    breaker.record_failure()
    with pytest.raises(CircuitOpen) as info:
        breaker.check()
    assert info.value.code == "circuit-open"
    assert info.value.name == "svc"
    assert info.value.retry_after > 0


def test_compat_builtins() -> None:
    """The typed errors that replace builtins are still those builtins for old callers."""
    assert issubclass(BadInput, ValueError)
    assert issubclass(Closed, ValueError)
    assert issubclass(WrongType, TypeError)
    assert issubclass(Misuse, RuntimeError)
    with pytest.raises(WrongType):
        mighty.Budget(fuel="many")  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="fuel"):
        mighty.Budget(fuel=-1)


def test_no_bare_builtin_raised_beyond_the_internal_ones() -> None:
    """No `raise ValueError/TypeError/RuntimeError` in mighty but the listed internal ones."""
    found: set[tuple[str, str]] = set()
    for module, path in _modules().items():

        def walk(node: ast.AST, function: str, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                name = function
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = child.name
                if isinstance(child, ast.Raise) and child.exc is not None:
                    exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                    if isinstance(exc, ast.Name) and exc.id in {
                        "ValueError",
                        "TypeError",
                        "RuntimeError",
                    }:
                        found.add((module, name))
                walk(child, name)

        walk(_tree(path), "<module>")
    assert found == INTERNAL_RAISES
