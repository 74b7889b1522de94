"""Recorded HTTP exchanges: rebuilt from a trace's imports, and answering a member's requests
by request key (method, URL, body) with no network, whatever its read sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mighty import Budget, Instance
from mighty.abi import Err, Ok, Variant
from mighty.engine import Component
from mighty.eval import Case, Equal, Member, Suite
from mighty.trace import Recorder, TraceAnswers, TraceWriter, read_trace
from mighty.trace._http import RecordedHttp, Unmatched, recorded_exchanges
from mighty.wasi import HTTP_RESPONDER, Policy
from tests.wasi import make_ctx, obj
from tests.wasi.http_servers import LoopbackServer, pattern
from tests.wasi.test_http import read_all, response, send

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recorded(http_probe_wasm: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A trace of the probe posting to /echo and streaming /bytes, and the server's origin
    (the server is closed before any test runs: nothing can reach it)."""
    trace = tmp_path_factory.mktemp("http_trace") / "run.bin"
    with LoopbackServer() as server, Recorder(trace) as recorder:
        policy = Policy().with_http(server.origin)
        budget = Budget(fuel=10**11, timeout=60.0)
        probe = Component.load(http_probe_wasm)
        with Instance(probe, budget=budget, policy=policy, record=recorder) as guest:
            guest.call("fetch", "POST", server.url("/echo"), [("x-a", "1")], b"question", 5000)
            guest.call("stream-sum", server.url("/bytes/100000?chunk=7000"))
        origin = server.origin
    return trace, origin


def _imports(trace: Path) -> list[dict[str, Any]]:
    return [r for r in read_trace(trace).all_records if r.get("k") == "import"]


def test_each_request_is_rebuilt_from_the_imports(recorded: Any) -> None:
    """Method, URL, body, status, headers and the body chunks as read come back per request."""
    trace, origin = recorded
    echo, stream = recorded_exchanges(_imports(trace))
    assert (echo.method, echo.url, bytes(echo.body)) == ("POST", origin + "/echo", b"question")
    assert echo.status == 200 and b'"method": "POST"' in b"".join(echo.chunks)
    assert any(k.lower() == b"content-type" for k, _ in echo.headers)
    assert (stream.method, stream.url) == ("GET", origin + "/bytes/100000?chunk=7000")
    assert b"".join(stream.chunks) == pattern(0, 100_000)
    assert stream.body_error is None


def test_a_request_is_answered_by_key_whatever_the_read_sizes(recorded: Any) -> None:
    """The same request made through other calls, read 5,000 bytes at a time, gets the
    recorded body byte for byte, with the server gone."""
    trace, origin = recorded
    answers = RecordedHttp(recorded_exchanges(_imports(trace)), lambda _r: False)
    ctx = make_ctx(Policy().with_http(origin))
    ctx.put(HTTP_RESPONDER, answers)
    incoming = response(ctx, send(ctx, origin + "/bytes/100000?chunk=7000").value)
    data, error = read_all(ctx, obj(ctx, incoming.value))
    assert error is None
    assert data == pattern(0, 100_000)
    assert len(answers.answered) == 1


def test_a_request_the_recording_lacks_is_refused_and_reported(recorded: Any) -> None:
    """Another URL or another body is unmatched: refused, and the callback names it."""
    trace, origin = recorded
    seen: list[Unmatched] = []

    def unmatched(request: Unmatched) -> bool:
        seen.append(request)
        return False

    ctx = make_ctx(Policy().with_http(origin))
    ctx.put(HTTP_RESPONDER, RecordedHttp(recorded_exchanges(_imports(trace)), unmatched))
    got = response(ctx, send(ctx, origin + "/echo", method="post", body=b"another").value)
    assert got == Err(Variant("HTTP-request-denied"))
    assert seen[0].describe() == f"HTTP POST {origin}/echo, a 7-byte body"


def _with_call_args(trace: Path, out: Path, fn: str, args: list[Any]) -> Path:
    """A copy of ``trace`` whose export call ``fn`` is made with ``args`` instead."""
    source = read_trace(trace)
    header = {k: v for k, v in source.header.items() if k not in ("k", "format")}
    with TraceWriter(out, header) as writer:
        for original in source.all_records:
            record = {k: v for k, v in original.items() if k != "@"}
            if record.get("k") == "call" and record.get("fn") == fn:
                record["args"] = args
            writer.append(record)
    return out


def test_eval_scores_a_member_on_recorded_traffic(
    recorded: Any, http_probe_wasm: Path, tmp_path: Path
) -> None:
    """mty eval's suite answers the member's requests from the recording (the server is gone):
    pass; a member asking for another body is diverged, naming the request."""
    trace, origin = recorded
    member = Member.component("probe", http_probe_wasm)
    report = Suite([Case("recorded", trace)], [member], [Equal()]).run()
    assert [c.verdict for c in report.cells] == ["pass"], report.cells[0].reason
    asked = _with_call_args(
        trace,
        tmp_path / "asked.bin",
        "fetch",
        ["POST", origin + "/echo", [("x-a", "1")], b"other", 5000],
    )
    report = Suite([Case("other-question", asked)], [member], [Equal()]).run()
    cell = report.cells[0]
    assert cell.verdict == "diverged"
    assert f"HTTP POST {origin}/echo, a 5-byte body" in cell.reason


def test_live_sends_an_unmatched_request_to_the_origin(
    http_probe_wasm: Path, tmp_path: Path
) -> None:
    """Under live, a request the recording lacks goes to the real origin (the recorded grant
    applies), and the cell says where it left the trace; matched ones still come from it."""
    trace = tmp_path / "run.bin"
    member = Member.component("probe", http_probe_wasm)
    with LoopbackServer() as server:
        with Recorder(trace) as recorder:
            policy = Policy().with_http(server.origin)
            budget = Budget(fuel=10**11, timeout=60.0)
            probe = Component.load(http_probe_wasm)
            with Instance(probe, budget=budget, policy=policy, record=recorder) as guest:
                guest.call("fetch", "POST", server.url("/echo"), [], b"question", 5000)
        asked = _with_call_args(
            trace, tmp_path / "asked.bin", "fetch", ["POST", server.url("/echo"), [], b"new", 5000]
        )
        before = len(server.requests)
        same = Suite([Case("same", trace)], [member], [Equal()], policy="live").run()
        assert len(server.requests) == before  # answered from the recording
        report = Suite([Case("new", asked)], [member], [Equal()], policy="live").run()
        arrived = server.requests[before:]
    assert same.cells[0].verdict == "pass"
    assert [r.body for r in arrived] == [b"new"]
    cell = report.cells[0]
    assert cell.verdict == "fail"  # the echo differs from the baseline's, as it should
    assert cell.live_from is not None and "wasi:http/outgoing-handler#handle" in cell.live_from


def _cut_points(imports: list[dict[str, Any]]) -> dict[str, int]:
    """Where a crash could cut the log inside the second request: after its ``handle`` (no
    response logged), and after its first body read (the body read part way)."""
    handles = [i for i, r in enumerate(imports) if r["fn"] == "handle"]
    reads = [
        i
        for i, r in enumerate(imports)
        if i > handles[1] and r["fn"] == "[method]input-stream.read" and isinstance(r["res"], Ok)
    ]
    return {"no response": handles[1] + 1, "part of the body": reads[0] + 1}


def test_resume_makes_the_request_a_crash_cut_short_again_live(recorded: Any) -> None:
    """A log cut inside its last request (no response logged, or a body read part way): a
    recovery's ``resume`` does not answer that request from it (it would fail as incomplete)
    but sends it live; the whole log still answers it."""
    trace, origin = recorded
    # The requests' calls only: this test makes no other import a recovery would retrace.
    imports = [r for r in _imports(trace) if str(r["if"]).startswith(("wasi:http", "wasi:io"))]
    url = origin + "/bytes/100000?chunk=7000"
    assert all(e.complete for e in recorded_exchanges(imports))
    whole = TraceAnswers(imports, instance=1, policy="resume", http=True)
    ctx = make_ctx(Policy().with_http(origin))
    ctx.put(HTTP_RESPONDER, whole.http)
    incoming = response(ctx, send(ctx, url).value)
    assert read_all(ctx, obj(ctx, incoming.value)) == (pattern(0, 100_000), None)
    assert whole.live_from is None
    for what, cut in _cut_points(imports).items():
        part = imports[:cut]
        echo, stream = recorded_exchanges(part)
        assert echo.complete and not stream.complete, what
        answers = TraceAnswers(part, instance=1, policy="resume", http=True)
        ctx = make_ctx(Policy().with_http(origin))
        ctx.put(HTTP_RESPONDER, answers.http)
        got = response(ctx, send(ctx, url).value)  # live: the server is gone, so refused
        assert got != Err(Variant("HTTP-response-incomplete")), what
        assert answers.live_from is not None, what
        assert answers.http is not None and answers.http.answered == [], what
