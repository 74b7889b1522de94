"""The record schema the recorder writes and the replayer relies on, checked on read.

The format layer accepts any record with a text ``"k"`` (a trace can carry kinds of its own);
the replayer and ``mty trace show`` read the five kinds below and used to index them blindly,
so a record with valid checksums but a missing field or a field of the wrong type ended in
"internal error: KeyError". Each record of a known kind is checked here, field by field, and a
bad one is a ``TraceInvalid`` naming its frame's byte offset. Unknown kinds pass untouched.

Rejected: checking in the reader itself (format-level tests and tools write free-form records
of these kinds on purpose) and a schema library (the whole schema is a table of five rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mighty.trace._errors import TraceInvalid

__all__ = ["OUTCOMES", "check_record"]

OUTCOMES = frozenset({"ok", "exit", "violation", "host_error"})

Check = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_str(v: Any) -> bool:
    return type(v) is str


def _is_bytes(v: Any) -> bool:
    return type(v) is bytes


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _any(_v: Any) -> bool:
    return True


def _opt_int(v: Any) -> bool:
    return v is None or type(v) is int


def _is_list(v: Any) -> bool:
    return type(v) is list


def _is_dict(v: Any) -> bool:
    return type(v) is dict


def _is_budget(v: Any) -> bool:
    if type(v) is not dict or set(v) - {"fuel", "memory", "timeout"}:
        return False
    return all(
        type(v[key]) is int if key != "timeout" else type(v[key]) in (int, float) for key in v
    )


def _is_sha(v: Any) -> bool:
    return type(v) is str and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _is_outcome(v: Any) -> bool:
    return type(v) is str and v in OUTCOMES


def _is_error(v: Any) -> bool:
    return v is None or (
        type(v) is dict and type(v.get("kind")) is str and type(v.get("message")) is str
    )


# kind -> (required fields, optional fields), each field -> its check.
_SCHEMA: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "instance": (
        {"i": _is_int, "component": _is_sha, "budget": _is_budget},
        {"path": _is_str, "size": _opt_int, "policy": _is_dict},
    ),
    "import": (
        {
            "i": _is_int,
            "s": _is_int,
            "if": _is_str,
            "fn": _is_str,
            "args": _is_list,
            "res": _any,
            "out": _is_outcome,
        },
        {"fuel": _opt_int},
    ),
    "call": (
        {"i": _is_int, "s": _is_int, "fn": _is_str, "args": _is_list, "budget": _is_budget},
        {},
    ),
    "export": (
        {
            "i": _is_int,
            "s": _is_int,
            "fn": _is_str,
            "res": _any,
            "ok": _is_bool,
            "error": _is_error,
        },
        {"fuel": _opt_int, "memory_peak": _opt_int},
    ),
    "close": ({"i": _is_int, "stdout": _is_bytes, "stderr": _is_bytes}, {"digest": _is_str}),
}


# Every kind may name the agent the instance is (its address, ``type:pid``): traces of
# format 1 written before agents were recorded have no such field.
for _required, _optional in _SCHEMA.values():
    _optional["a"] = _is_str
_SCHEMA["instance"][1]["name"] = _is_str


def check_record(record: dict[str, Any], offset: int) -> None:
    """Raise ``TraceInvalid`` (at ``offset``) unless ``record`` follows its kind's schema."""
    kind = record.get("k")
    if kind == "import" and _good_import(record):
        return  # most records of a trace: the table's checks, unrolled (the table says why not)
    rule = _SCHEMA.get(kind) if type(kind) is str else None
    if rule is None:
        return
    required, optional = rule
    for name, check in required.items():
        if name not in record:
            raise TraceInvalid(
                f'{kind} record at byte {offset} has no "{name}" field', offset=offset
            )
        if not check(record[name]):
            raise TraceInvalid(
                f'{kind} record at byte {offset}: field "{name}" is a '
                f"{type(record[name]).__name__} of the wrong shape",
                offset=offset,
            )
    for name, check in optional.items():
        if name in record and not check(record[name]):
            raise TraceInvalid(
                f'{kind} record at byte {offset}: field "{name}" is a '
                f"{type(record[name]).__name__} of the wrong shape",
                offset=offset,
            )
    if kind == "export" and (record["error"] is None) != record["ok"]:
        raise TraceInvalid(
            f"export record at byte {offset}: an error goes with ok false, and only there",
            offset=offset,
        )
    if kind == "import" and record["out"] == "exit" and type(record["res"]) is not int:
        raise TraceInvalid(
            f"import record at byte {offset}: an exit's result must be its int code",
            offset=offset,
        )


def _good_import(record: dict[str, Any]) -> bool:
    """The import row of ``_SCHEMA`` (and the exit rule) for a record that passes it; False
    sends the record to the table, which names what is wrong."""
    get = record.get
    out = get("out")
    fuel = get("fuel")
    agent = get("a", "")
    return (
        type(get("i")) is int
        and type(get("s")) is int
        and type(get("if")) is str
        and type(get("fn")) is str
        and type(get("args")) is list
        and "res" in record
        and type(out) is str
        and out in OUTCOMES
        and (fuel is None or type(fuel) is int)
        and type(agent) is str
        and (out != "exit" or type(record["res"]) is int)
    )
