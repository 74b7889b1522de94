"""The run context in code mode: tools take it, and one cancel reaches tools and nested runs."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import mighty.sandbox._api as sandbox_api
from mighty.budget import current_context
from mighty.sandbox import (
    Busy,
    CancelScope,
    Limits,
    RunContext,
    RunHandle,
    Sandbox,
)
from tests.sandbox._helpers import failed

pytestmark = pytest.mark.slow

WAIT = 30.0
"""How long a test waits for something that happens at once on a quiet machine."""


def test_a_tool_takes_the_run_context_and_the_code_cannot_pass_it() -> None:
    """A tool annotated with RunContext gets the call's context; the code never sees it."""
    seen: list[RunContext] = []

    def where(ctx: RunContext, label: str) -> str:
        """Say where the call runs."""
        seen.append(ctx)
        return f"{label}:{ctx.kind}"

    def later(label: str, *, context: RunContext) -> str:
        seen.append(context)
        return label

    with Sandbox(tools=[where, later], limits=Limits(tool_timeout=7.0)) as box:
        result = box.run("[where('a'), where(label='b'), later('c')]")
        assert result.ok, result.error
        assert result.value == ["a:tool", "b:tool", "c"]
        assert "ctx" not in box.describe_tools() and "context" not in box.describe_tools()
        assert "def where(label: str) -> str:" in box.describe_tools()
        refused = box.run("where(1, 'x')")
        assert refused.error is not None and "TypeError" in refused.error.message
        passed = box.run("later('x', context=None)")
        assert passed.error is not None and "unexpected keyword" in passed.error.message
    first, second, third = seen[:3]
    assert first.parent is not None and first.parent == second.parent == third.parent
    assert first.id != second.id and first.id.startswith(first.parent + "/where#")
    assert first.depth == 1 and first.agent is None
    remaining = first.remaining()
    assert remaining is not None and 0 < remaining <= 7.0
    assert not first.cancelled


def test_tool_signature_rules_are_checked_when_it_is_registered() -> None:
    """A RunContext parameter that is neither first nor keyword-only, or two, are refused."""

    def middle(a: int, ctx: RunContext, b: int) -> int:
        return a + b

    def twice(ctx: RunContext, *, other: RunContext) -> int:
        return 0

    with pytest.raises(ValueError, match="first parameter or keyword-only"):
        Sandbox(tools=[middle])
    with pytest.raises(ValueError, match="only one parameter"):
        Sandbox(tools=[twice])


def test_cancelling_a_run_reaches_a_sync_tool_that_checks_its_context(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tool sees ctx.cancelled, the run ends 'cancelled', the log says cancelled."""
    started, saw_cancel = threading.Event(), threading.Event()

    def crawl(ctx: RunContext) -> int:
        started.set()
        pages = 0
        while not ctx.cancelled:
            pages += 1
            time.sleep(0.005)
        saw_cancel.set()
        return pages

    cancel = CancelScope()
    with Sandbox(tools=[crawl], limits=Limits(tool_timeout=600.0)) as box:
        handle = box.start("crawl()", cancel=cancel)
        assert started.wait(WAIT)
        with caplog.at_level(logging.WARNING, logger="mighty.sandbox"):
            cancel.cancel("the user pressed stop")
            result = handle.result(WAIT)
        failed(result, "cancelled")
        assert handle.status == "cancelled"
        assert saw_cancel.wait(WAIT), "the tool never saw its context cancelled"
    assert "timed out" not in caplog.text


def test_a_run_started_by_a_tool_is_cancelled_with_the_outer_run() -> None:
    """A nested run inherits the tool's context: cancelling the outer run stops it too."""
    nested: dict[str, Any] = {}
    inside = threading.Event()

    def delegate(ctx: RunContext) -> str:
        inner_box = nested["box"]
        handle = inner_box.start("while True:\n    pass")
        nested["context"] = handle.context
        inside.set()
        result = handle.result(WAIT)
        nested["kind"] = None if result.error is None else result.error.kind
        return "done"

    with (
        Sandbox(limits=Limits(timeout=600.0, fuel=10**15)) as inner,
        Sandbox(tools=[delegate], limits=Limits(tool_timeout=600.0)) as box,
    ):
        nested["box"] = inner
        handle = box.start("delegate()")
        assert inside.wait(WAIT)
        context = nested["context"]
        assert context.parent is not None and context.parent.startswith(handle.id + "/delegate#")
        assert context.depth == 2
        handle.cancel("stop everything")
        failed(handle.result(WAIT), "cancelled")
        deadline = time.monotonic() + WAIT
        while "kind" not in nested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert nested.get("kind") == "cancelled"


def test_an_async_tool_sees_its_context_cancelled_with_the_run() -> None:
    """An async tool gets CancelledError, and its context says cancelled."""
    started = threading.Event()
    seen: dict[str, Any] = {}

    async def wait_forever(ctx: RunContext) -> None:
        seen["ctx"] = ctx
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise

    with Sandbox(tools=[wait_forever], limits=Limits(tool_timeout=600.0)) as box:
        handle = box.start("await wait_forever()")
        assert started.wait(WAIT)
        handle.cancel()
        failed(handle.result(WAIT), "cancelled")
        deadline = time.monotonic() + WAIT
        while not seen["ctx"].cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen["ctx"].cancelled
        while "cancelled" not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen.get("cancelled") is True


@pytest.mark.parametrize("trigger", ["sync", "async", "nested"])
def test_one_cancel_stops_every_part_of_a_run(trigger: str) -> None:
    """Cancelled from inside any part, the sync tool, the async tool and the nested run all
    report cancelled."""
    reports: dict[str, str] = {}
    ready = threading.Barrier(3, timeout=WAIT)
    holder: dict[str, Any] = {}

    def fire(part: str) -> None:
        if part == trigger:
            holder["handle"].cancel(f"cancelled from the {part} part")

    def sync_part(ctx: RunContext) -> None:
        ready.wait()
        fire("sync")
        while not ctx.cancelled:
            time.sleep(0.005)
        reports["sync"] = "cancelled"

    async def async_part(ctx: RunContext) -> None:
        try:  # the cancel may come while it still waits for the others
            await asyncio.to_thread(ready.wait)
            fire("async")
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            reports["async"] = "cancelled"
            raise

    async def nested_part(ctx: RunContext) -> None:
        handle = holder["inner"].start("while True:\n    pass")

        def watch() -> None:
            result = handle.result(WAIT)
            reports["nested"] = "" if result.error is None else result.error.kind

        threading.Thread(target=watch, daemon=True).start()
        await asyncio.to_thread(ready.wait)
        fire("nested")
        await asyncio.sleep(3600)

    code = (
        "import asyncio\n"
        "a = asyncio.ensure_future(async_part())\n"
        "n = asyncio.ensure_future(nested_part())\n"
        "await asyncio.sleep(0)\n"
        "sync_part()\n"
        "await asyncio.gather(a, n)\n"
    )
    limits = Limits(tool_timeout=600.0, timeout=600.0)
    with (
        Sandbox(limits=Limits(timeout=600.0, fuel=10**15)) as inner,
        Sandbox(tools=[sync_part, async_part, nested_part], limits=limits) as box,
    ):
        holder["inner"] = inner
        handle = holder["handle"] = box.start(code)
        result = handle.result(WAIT)
        failed(result, "cancelled")
        deadline = time.monotonic() + WAIT
        while len(reports) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert reports == {"sync": "cancelled", "async": "cancelled", "nested": "cancelled"}


def test_progress_reaches_on_output() -> None:
    """ctx.progress(...) in a tool is the run's 'progress' output stream."""
    heard: list[tuple[str, str]] = []

    def fetch(ctx: RunContext, n: int) -> int:
        for i in range(n):
            ctx.progress("fetching", done=i + 1, total=n)
        ctx.progress("x" * 5000)
        return n

    with Sandbox(tools=[fetch]) as box:
        result = box.run("fetch(2)", on_output=lambda stream, text: heard.append((stream, text)))
    assert result.ok, result.error
    progress = [text for stream, text in heard if stream == "progress"]
    assert progress[:2] == ["fetching (1/2)\n", "fetching (2/2)\n"]
    assert len(progress[2]) == 1001


def test_a_handle_reports_status_and_result() -> None:
    """start() returns at once; status moves from running to ok; result() waits."""
    gate = threading.Event()

    def hold() -> int:
        gate.wait(WAIT)
        return 5

    with Sandbox(tools=[hold]) as box:
        handle = box.start("hold() * 2")
        assert isinstance(handle, RunHandle) and handle.status == "running"
        with pytest.raises(TimeoutError):
            handle.result(0)
        gate.set()
        result = handle.result(WAIT)
        assert result.ok and result.value == 10
        assert handle.status == "ok" and handle.done()
        assert handle.id.startswith("run-")


def test_too_many_started_runs_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_STARTED_RUNS runs in flight, start() says Busy; one finishing frees a place."""
    monkeypatch.setattr(sandbox_api, "MAX_STARTED_RUNS", 2)
    gate = threading.Event()

    def hold() -> None:
        gate.wait(WAIT)

    with Sandbox(tools=[hold]) as box:
        first, second = box.start("hold()"), box.start("hold()")
        with pytest.raises(Busy, match="2 started runs"):
            box.start("hold()")
        gate.set()
        assert first.result(WAIT).ok and second.result(WAIT).ok
        assert box.start("1").result(WAIT).ok


def test_a_run_made_inside_a_context_is_its_child() -> None:
    """A run started under a context (a tool, an agent) is cancelled with it."""
    outer = RunContext.top("request")
    from mighty.budget import using_context

    with Sandbox() as box, using_context(outer):
        handle = box.start("while True:\n    pass")
        assert handle.context.parent == outer.id
        assert current_context() is outer
        outer.stop("the request was dropped")
        failed(handle.result(WAIT), "cancelled")


def test_the_host_refuses_a_context_passed_by_hostile_code() -> None:
    """Bypassing the stub, a call that names the context parameter is a TypeError."""
    from mighty.sandbox import Tool

    def later(label: str, *, context: RunContext) -> str:
        return label

    tool = Tool(later)
    assert tool.context_param == "context" and not tool.context_first
    with pytest.raises(TypeError):
        tool.arguments(["x"], {"context": None})
    assert [p["name"] for p in tool.spec()["params"]] == ["label"]
