"""No run can bring `mty sandbox serve` down: every reply is checked, every failure answered."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mighty.sandbox._mcp import RUN_PYTHON, build_server, checked_call_result
from tests.sandbox_mcp.test_mcp import _FIRST_CALL_TIMEOUT, OK_DOC, _drive, _kind, _serve, _value


class _Result:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def to_json(self) -> dict[str, Any]:
        return self.document


class _HostileSandbox:
    """Code "surrogate"/"inf" return documents that do not serialise; "boom" raises."""

    def describe_tools(self) -> str:
        return ""

    def close(self) -> None:
        pass

    async def run_async(self, code: str, inputs: Mapping[str, Any] | None = None) -> _Result:
        if code == "surrogate":
            return _Result(OK_DOC | {"value": "\ud800"})
        if code == "inf":
            return _Result(OK_DOC | {"value": [math.inf, -math.inf]})
        if code == "boom":
            raise RuntimeError("a bug in the host")
        return _Result(OK_DOC)


def test_checked_call_result_replaces_what_cannot_be_written() -> None:
    """A document with a lone surrogate or infinity becomes an internal error result."""
    for bad in ("\ud800", math.inf, {"\udfff": 1}):
        result = checked_call_result(OK_DOC | {"value": bad})
        assert result.is_error is True
        assert result.structured_content is not None
        assert result.structured_content["error"]["kind"] == "internal"
        result.model_dump_json(by_alias=True, exclude_none=True)
    assert checked_call_result(OK_DOC).is_error is False


def test_server_survives_unserialisable_replies_and_host_bugs() -> None:
    """Through the SDK: bad replies and a raising sandbox answer that call; the next is fine."""

    async def scenario() -> None:
        async with Client(build_server(_HostileSandbox)) as client:
            for code in ("surrogate", "inf", "boom"):
                bad = await client.call_tool(RUN_PYTHON, {"code": code})
                assert bad.is_error is True
                assert bad.structured_content is not None
                assert bad.structured_content["error"]["kind"] == "internal"
                good = await client.call_tool(RUN_PYTHON, {"code": "x"})
                assert good.is_error is False

    anyio.run(scenario)


@pytest.mark.slow
def test_serve_survives_a_forged_surrogate_result(tmp_path: Path) -> None:
    """Over stdio: a run forging a lone-surrogate result is an exception; the server goes on."""
    errlog_path = tmp_path / "server.err"
    forge = "import interpreter\ninterpreter._dumps = lambda v, w: b'\"\\\\ud800\"'\nresult = 1"
    infinite = "import interpreter\ninterpreter._dumps = lambda v, w: b'[1e999]'\nresult = 1"
    huge_name = "from wit_world.imports import tools\ntools.call('\\x01' * 5_000_000, b'{}')"

    async def scenario() -> None:
        with errlog_path.open("w") as errlog:
            async with _serve(errlog=errlog) as session:
                forged = await session.call_tool(RUN_PYTHON, {"code": forge}, _FIRST_CALL_TIMEOUT)
                assert _kind(forged) == "exception"
                assert _kind(await session.call_tool(RUN_PYTHON, {"code": infinite})) == (
                    "exception"
                )
                named = await session.call_tool(RUN_PYTHON, {"code": huge_name})
                assert _kind(named) == "not_allowed"
                assert named.structured_content is not None
                assert len(named.structured_content["error"]["message"]) < 200
                again = await session.call_tool(RUN_PYTHON, {"code": "result = 'alive'"})
                assert _value(again) == "alive"

    _drive(scenario, errlog_path)
