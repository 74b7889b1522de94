"""The suite file (TOML): cases, members and comparators, every path relative to the file.

::

    policy = "strict"          # or "live"; a case may override it
    workers = 2

    [[case]]
    name = "greet"
    trace = "traces/greet.bin"
    agent = "assistant"        # optional: this agent's instances of a `mty run --record` trace
    compare = ["messages"]     # optional: names of [[compare]] entries (default: all)

    [[member]]
    name = "v2"
    wasm = "build/assistant-v2.wasm"   # or: source = "assistant_v2.py" (built), or for code
                                       # cases: code = "program.py" and/or tools = "tools.py"

    [[compare]]
    name = "equal"             # equal | semantic | tool-calls | a registered comparator
    on = "result"              # the comparator's own options
    id = "result"              # optional: how cases refer to it (default: its name)

A file that is not this (bad TOML, an unknown key, a missing field, a comparator that does not
exist, a threshold outside [0, 1]) is a ``SuiteFileError`` with one line naming the place; a
trace or member that cannot be used is not: it makes those cells ``error`` and the suite goes
on. A tools file is Python, run in this process (it is your code, as a pytest conftest is): its
``TOOLS`` (a list or a name -> callable dict) or else every public function it defines.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import tomllib
from pathlib import Path
from typing import Any

from mighty._errors import BadInput
from mighty._files import FileRefused, read_regular_file
from mighty.eval._case import Case, Member
from mighty.eval._compare import Comparator, make_comparator
from mighty.eval._suite import MAX_WORKERS, Suite

__all__ = [
    "MAX_CELLS",
    "MAX_CODE_FILE",
    "MAX_SUITE_FILE",
    "SuiteFileError",
    "load_suite",
    "load_tools",
]

MAX_SUITE_FILE = 1 << 20
"""Largest suite file read (bytes)."""
MAX_CODE_FILE = 1 << 20
"""The largest member program or tools file read."""
MAX_CELLS = 10_000
"""Cases x members one suite file may ask for."""
MAX_ENTRIES = 10_000
_TOP = {"policy", "workers", "case", "member", "compare"}
_CASE = {"name", "trace", "agent", "instance", "compare", "policy"}
_MEMBER = {"name", "wasm", "source", "code", "tools"}


class SuiteFileError(BadInput):
    """The suite file is malformed; the message is one line naming where."""


def _fail(path: Path, message: str) -> SuiteFileError:
    return SuiteFileError(f"{path}: {message}")


def _table_list(path: Path, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = data.get(key, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise _fail(path, f"{key} must be an array of tables ([[{key}]])")
    if len(items) > MAX_ENTRIES:
        raise _fail(path, f"more than {MAX_ENTRIES} [[{key}]] entries")
    return items


def _str(
    path: Path, where: str, table: dict[str, Any], key: str, required: bool = False
) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            raise _fail(path, f"{where}: missing {key}")
        return None
    if not isinstance(value, str) or not value:
        raise _fail(path, f"{where}: {key} must be a non-empty string")
    return value


def _unknown(path: Path, where: str, table: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise _fail(
            path, f"{where}: unknown key {extra[0]!r} (known: {', '.join(sorted(allowed))})"
        )


def load_tools(path: Path) -> dict[str, Any]:
    """The tool set a tools file defines (``TOOLS``, or its public functions)."""
    name = f"mighty_eval_tools_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BadInput(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's file is one line
        raise BadInput(f"{path}: importing the tools failed: {type(exc).__name__}: {exc}") from None
    tools = getattr(module, "TOOLS", None)
    if tools is None:
        return {
            n: f
            for n, f in vars(module).items()
            if inspect.isfunction(f) and f.__module__ == name and not n.startswith("_")
        }
    if isinstance(tools, dict):
        return dict(tools)
    if isinstance(tools, list | tuple):
        return {getattr(f, "__name__", str(i)): f for i, f in enumerate(tools)}
    raise BadInput(f"{path}: TOOLS must be a list or a dict")


def load_suite(path: str | Path, *, workers: int | None = None) -> Suite:  # noqa: PLR0915
    """The suite the file at ``path`` describes; ``SuiteFileError`` when it is malformed."""
    path = Path(path)
    base = path.parent
    try:
        raw = read_regular_file(path, MAX_SUITE_FILE)
    except FileRefused as exc:
        raise _fail(path, exc.message) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _fail(path, "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise _fail(path, f"not valid TOML: {exc}") from None
    except RecursionError:
        raise _fail(path, "not valid TOML: nested too deeply") from None
    _unknown(path, "top level", data, _TOP)
    policy = data.get("policy", "strict")
    if policy not in ("strict", "live"):
        raise _fail(path, f"policy must be 'strict' or 'live', got {policy!r}")
    file_workers = data.get("workers", 2)
    if (
        isinstance(file_workers, bool)
        or not isinstance(file_workers, int)
        or not (1 <= file_workers <= MAX_WORKERS)
    ):
        raise _fail(path, f"workers must be an int in 1..{MAX_WORKERS}")

    comparators: dict[str, Comparator] = {}
    for n, table in enumerate(_table_list(path, data, "compare"), 1):
        where = f"compare #{n}"
        name = _str(path, where, table, "name", required=True)
        assert name is not None
        ident = _str(path, where, table, "id") or name
        if ident in comparators:
            raise _fail(path, f"{where}: a second comparator with id {ident!r} (give it an id)")
        options = {k: v for k, v in table.items() if k not in ("name", "id")}
        try:
            comparators[ident] = make_comparator(name, options)
        except BadInput as exc:
            raise _fail(path, f"{where}: {exc.message}") from None

    cases: list[Case] = []
    for n, table in enumerate(_table_list(path, data, "case"), 1):
        where = f"case #{n}"
        _unknown(path, where, table, _CASE)
        name = _str(path, where, table, "name", required=True)
        trace = _str(path, where, table, "trace", required=True)
        assert name is not None
        assert trace is not None
        instance = table.get("instance")
        if instance is not None and (isinstance(instance, bool) or not isinstance(instance, int)):
            raise _fail(path, f"{where}: instance must be an int")
        chosen: tuple[Comparator, ...] | None = None
        if "compare" in table:
            ids = table["compare"]
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or not ids:
                raise _fail(path, f"{where}: compare must be a non-empty list of comparator ids")
            missing = [i for i in ids if i not in comparators]
            if missing:
                raise _fail(
                    path,
                    f"{where}: no comparator with id {missing[0]!r} "
                    f"(ids: {', '.join(comparators) or 'none'})",
                )
            chosen = tuple(comparators[i] for i in ids)
        case_policy = table.get("policy")
        if case_policy not in (None, "strict", "live"):
            raise _fail(path, f"{where}: policy must be 'strict' or 'live'")
        cases.append(
            Case(
                name,
                base / trace,
                agent=_str(path, where, table, "agent"),
                instance=instance,
                compare=chosen,
                policy=case_policy,
            )
        )

    members: list[Member] = []
    for n, table in enumerate(_table_list(path, data, "member"), 1):
        where = f"member #{n}"
        _unknown(path, where, table, _MEMBER)
        name = _str(path, where, table, "name", required=True)
        assert name is not None
        wasm, source = _str(path, where, table, "wasm"), _str(path, where, table, "source")
        code, tools = _str(path, where, table, "code"), _str(path, where, table, "tools")
        if sum(x is not None for x in (wasm, source, code or tools)) != 1:
            raise _fail(path, f"{where}: give exactly one of wasm, source, or code/tools")
        if wasm is not None:
            members.append(Member(name, wasm=base / wasm))
        elif source is not None:
            members.append(Member(name, source=base / source))
        else:
            try:
                text = (
                    read_regular_file(base / code, MAX_CODE_FILE).decode("utf-8")
                    if code is not None
                    else None
                )
                if tools is not None:
                    read_regular_file(base / tools, MAX_CODE_FILE)  # a file, bounded, or refused
                toolset = load_tools(base / tools) if tools is not None else None
            except OSError as exc:
                raise _fail(path, f"{where}: {exc.strerror or exc}: {exc.filename}") from None
            except (BadInput, UnicodeDecodeError) as exc:
                raise _fail(path, f"{where}: {exc}") from None
            members.append(Member(name, code=text, tools=toolset))
    if not cases:
        raise _fail(path, "no [[case]]")
    if not members:
        raise _fail(path, "no [[member]]")
    if len(cases) * len(members) > MAX_CELLS:
        raise _fail(
            path,
            f"{len(cases)} cases x {len(members)} members is {len(cases) * len(members)} cells, "
            f"over the {MAX_CELLS} one suite runs (split it)",
        )
    try:
        return Suite(
            cases,
            members,
            tuple(comparators.values()),
            policy=policy,
            workers=workers or file_workers,
            base=base,
        )
    except BadInput as exc:
        raise _fail(path, exc.message) from None
