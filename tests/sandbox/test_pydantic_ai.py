"""pydantic-ai code mode: a real agent loop (FunctionModel) calls run_code in the sandbox."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from mighty.sandbox import Limits
from mighty.sandbox.integrations.pydantic_ai import MAX_RETRY_OUTPUT, MightyCodeToolset
from mighty.trace import ReplayEvent, replay_trace

pytestmark = pytest.mark.slow


def _replies(messages: list[ModelMessage]) -> list[str]:
    """What the model was told after each of its run_code calls (results and retry prompts)."""
    out = []
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if getattr(part, "tool_name", None) == "run_code":
                    out.append(str(getattr(part, "content", "")))
    return out


def scripted(codes: list[str]) -> Callable[[list[ModelMessage], AgentInfo], ModelResponse]:
    """A model that answers with run_code(codes[i]) in turn, then with the last reply as text."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert [t.name for t in info.function_tools] == ["run_code"]
        step = len(_replies(messages))
        if step < len(codes):
            return ModelResponse(
                parts=[ToolCallPart("run_code", {"code": codes[step]}, tool_call_id=f"c{step}")]
            )
        return ModelResponse(parts=[TextPart(_replies(messages)[-1])])

    return model


def make_tools(log: list[str]) -> FunctionToolset[None]:
    toolset: FunctionToolset[None] = FunctionToolset()
    arrived = {"n": 0}
    all_in = asyncio.Event()

    @toolset.tool_plain
    async def lookup(city: str) -> dict[str, Any]:
        """Weather of a city."""
        log.append(city)
        arrived["n"] += 1
        if arrived["n"] >= 3:
            all_in.set()
        # Returns only once three calls are in flight at once: proof they run concurrently.
        await asyncio.wait_for(all_in.wait(), 10)
        return {"city": city, "temp": len(city)}

    @toolset.tool_plain
    def convert(celsius: float, unit: str = "F") -> float:
        """Convert a temperature."""
        if unit != "F":
            raise ValueError(f"unknown unit {unit}")
        return celsius * 9 / 5 + 32

    return toolset


def run(codes: list[str], **options: Any) -> tuple[Any, list[str], list[str]]:
    log: list[str] = []
    toolset = MightyCodeToolset(make_tools(log), **options)
    try:
        agent = Agent(FunctionModel(scripted(codes)), toolsets=[toolset])
        # asyncio.run, not run_sync: run_sync leaves its event loop open for later calls.
        result = asyncio.run(agent.run("go"))
    finally:
        toolset.close()
    return result.output, _replies(result.all_messages()), log


def test_parallel_tool_calls_through_pydantic_ai(interpreter: object) -> None:
    """gather of wrapped tools runs them concurrently; the last expression is the result."""
    code = (
        "import asyncio\n"
        "rows = await asyncio.gather(*[lookup(city=c) for c in ['Oslo', 'Rome', 'Lima']])\n"
        "[r['temp'] for r in rows] + [await convert(celsius=100)]"
    )
    output, replies, log = run([code])
    assert sorted(log) == ["Lima", "Oslo", "Rome"]
    assert replies == ["[4, 4, 4, 212.0]"]
    assert output == "[4, 4, 4, 212.0]"


def test_an_exception_is_a_retry_and_the_model_recovers(interpreter: object) -> None:
    """A failing wrapped tool surfaces as a retry prompt; the model's next code succeeds."""
    failing = "await convert(celsius=1, unit='K')"
    fixed = "print('ok')\nawait convert(celsius=0)"
    output, replies, _ = run([failing, fixed])
    assert len(replies) == 2
    assert (
        "tool_error" in replies[0] and "ValueError" in replies[0] and "unknown unit K" in replies[0]
    )
    assert replies[1] == "{'result': 32.0, 'stdout': 'ok\\n'}"
    assert output == replies[1]


def test_invalid_arguments_are_caught_by_pydantic_ai_validation(interpreter: object) -> None:
    """Arguments are validated by pydantic-ai's pipeline; the code can catch the ToolError."""
    code = "try:\n    await convert(celsius='hot')\nexcept ToolError as e:\n    r = e.kind\nr"
    _, replies, _ = run([code])
    assert replies == ["ValidationError"]


def test_a_limit_breach_is_reported_for_a_retry(interpreter: object) -> None:
    """More tool calls than the limit ends the code with tool_limit, which the model sees."""
    over = "[convert(celsius=i) for i in range(5)]"
    _, replies, _ = run([over, "1 + 1"], limits=Limits(tool_calls=3))
    assert "tool_limit" in replies[0]
    assert "more than 3 tool calls" in replies[0]
    assert replies[1] == "2"
    spin, _, _ = run(["while True: pass", "'done'"], limits=Limits(timeout=0.3, fuel=10**12))
    assert spin == "done"


def test_run_code_calls_replay_from_their_traces(interpreter: object, tmp_path: Path) -> None:
    """Each run_code call writes a trace that replays exactly, without the tools."""
    code = (
        "import asyncio, random\n"
        "rows = await asyncio.gather(*[lookup(city=c) for c in ['Oslo', 'Rome', 'Lima']])\n"
        "[sorted(r['city'] for r in rows), random.random() < 2]"
    )
    _, replies, _ = run([code], record_dir=tmp_path)
    traces = sorted(tmp_path.glob("*.bin"))
    assert [t.name for t in traces] == ["run_code-c0.bin"]
    exported: list[Any] = []

    def observe(event: ReplayEvent) -> None:
        if event.kind == "export":
            exported.append(event.result)

    report = replay_trace(traces[0], observer=observe)
    assert report.instances[0].exports == 1
    assert len(exported) == 1
    assert replies == ["[['Lima', 'Oslo', 'Rome'], True]"]


def test_long_output_of_a_failed_run_is_cut_for_the_model(interpreter: object) -> None:
    """The retry prompt shows the end of long output, bounded, with the error."""
    noisy = "for i in range(5000):\n    print('line', i)\nraise ValueError('at the end')"
    _, replies, _ = run([noisy, "0"])
    assert "ValueError: at the end" in replies[0]
    assert "line 4999" in replies[0]
    assert "line 10\n" not in replies[0]
    assert "characters cut]" in replies[0]
    assert len(replies[0]) < MAX_RETRY_OUTPUT + 2000


def _description(toolset: MightyCodeToolset) -> str:
    """The run_code description the model is given for ``toolset``."""
    from pydantic_ai import RunContext
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    ctx: RunContext[None] = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    tools = asyncio.run(toolset.get_tools(ctx))
    return tools["run_code"].tool_def.description or ""


def test_description_shows_types_and_real_defaults(interpreter: object) -> None:
    """The stub of each tool has its parameter and return types and its real defaults."""
    toolset: FunctionToolset[None] = FunctionToolset()

    @toolset.tool_plain
    def year(title: str) -> int:
        """The year a film came out."""
        return 1999

    @toolset.tool_plain
    def search(
        query: str, limit: int = 5, lang: str | None = None, tags: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """Search the catalogue."""
        return []

    code = MightyCodeToolset(toolset)
    try:
        text = _description(code)
    finally:
        code.close()
    assert "async def year(*, title: str) -> int: ..." in text
    assert (
        "async def search(*, query: str, limit: int = 5, lang: str | None = None,"
        " tags: list[str] | None = None) -> list[dict[str, Any]]: ..."
    ) in text


def test_a_default_left_out_is_filled_by_pydantic_ai(interpreter: object) -> None:
    """An argument the code leaves out gets the tool's own default, not the stub's text."""
    output, _, _ = run(["await convert(celsius=100)"])
    assert output == "212.0"


def test_record_dir_as_a_string(interpreter: object, tmp_path: Path) -> None:
    """record_dir="rec" (a str) works: each run_code call is recorded under it."""
    folder = tmp_path / "rec"
    _, replies, _ = run(["6 * 7"], record_dir=str(folder))
    assert replies == ["42"]
    assert [t.name for t in folder.glob("*.bin")] == ["run_code-c0.bin"]


def test_bad_settings_are_refused_at_construction(tmp_path: Path) -> None:
    """A record_dir that is not a path, or is a file, and a negative pool fail at once."""
    from mighty._errors import BadInput, WrongType

    tools: FunctionToolset[None] = FunctionToolset()
    with pytest.raises(WrongType, match="record_dir must be a path"):
        MightyCodeToolset(tools, record_dir=3)  # type: ignore[arg-type]
    (tmp_path / "file").write_text("")
    with pytest.raises(BadInput, match="not a directory"):
        MightyCodeToolset(tools, record_dir=tmp_path / "file")
    with pytest.raises(BadInput, match="pool must be"):
        MightyCodeToolset(tools, pool=-1)
