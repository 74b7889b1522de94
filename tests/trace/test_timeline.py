"""Traces as timelines (issue 35 #4): `mty trace export --format chrome` writes trace-event JSON
that holds to the format's fields (checked here event by event: one track per agent, spans for
messages, instants for imports, flows for asks), and `mty trace show --html` writes a page that
renders in a real headless Chromium with a track per agent and a click showing a message."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty.abi import Ok
from mighty.cli import main
from mighty.trace import TraceWriter
from mighty.trace._timeline import chrome_trace, html_page, timeline_data
from tests.trace.test_replay import random_sum, record

_PHASES = {"X", "i", "M", "s", "f"}
_SHA = "ab" * 32
_BUDGET = {"fuel": 1000, "memory": 1 << 20, "timeout": 1.0}


def check_trace_events(document: dict[str, Any]) -> dict[int, str]:
    """Hold ``document`` to the trace-event format (JSON object form) as Perfetto and
    chrome://tracing read it; return the tracks (tid -> thread name)."""
    assert set(document) >= {"traceEvents"}
    events = document["traceEvents"]
    assert isinstance(events, list) and events
    json.dumps(document)  # plain JSON, nothing else
    tracks: dict[int, str] = {}
    slices: dict[int, list[tuple[float, float]]] = {}
    flows: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        assert event["ph"] in _PHASES, event
        assert isinstance(event["name"], str) and event["name"]
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name", "thread_sort_index")
            assert isinstance(event["args"], dict)
            if event["name"] == "thread_name":
                tracks[event["tid"]] = event["args"]["name"]
            continue
        assert isinstance(event["ts"], int | float) and event["ts"] >= 0
        if event["ph"] == "X":
            assert isinstance(event["dur"], int | float) and event["dur"] >= 0
            assert isinstance(event.get("args", {}), dict)
            slices.setdefault(event["tid"], []).append((event["ts"], event["ts"] + event["dur"]))
        elif event["ph"] == "i":
            assert event["s"] in ("g", "p", "t")
        else:
            assert isinstance(event["id"], int) and isinstance(event["cat"], str)
            flows.setdefault(event["id"], []).append(event)
    for tid, spans in slices.items():
        assert tid in tracks, f"a slice on track {tid}, which has no thread_name"
        spans.sort()
        for (_, end), (begin, _) in itertools.pairwise(spans):
            assert begin >= end, f"slices overlap on track {tid}: {spans}"
    for pair in flows.values():
        source, finish = sorted(pair, key=lambda e: e["ph"] != "s")
        assert (source["ph"], finish["ph"]) == ("s", "f") and finish["bp"] == "e"
        assert source["name"] == finish["name"] and source["cat"] == finish["cat"]
        # A flow starts inside a slice of its track and ends at a slice starting there.
        assert any(a <= source["ts"] <= b for a, b in slices[source["tid"]])
        assert any(a == finish["ts"] for a, _ in slices[finish["tid"]])
    return tracks


def test_chrome_export_of_an_ask_chain(relay_trace: Path, tmp_path: Path) -> None:
    """Three agents, three tracks; a span per message with its decoded body; four ask flows."""
    out = tmp_path / "relay.json"
    result = CliRunner().invoke(main, ["trace", "export", str(relay_trace), "-o", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    tracks = check_trace_events(document)
    assert sorted(tracks.values()) == ["relay:1 (a)", "relay:2 (b)", "relay:3 (c)"]
    events = document["traceEvents"]
    relays = [e for e in events if e["ph"] == "X" and e["name"] == "relay"]
    assert len(relays) == 6
    assert relays[0]["args"]["body"] == {"via": ["b", "c"], "tag": "first"}
    assert sum(1 for e in events if e["ph"] == "s") == 4  # a->b and b->c, twice
    assert any(e["ph"] == "i" and e["name"] == "mighty:agent/host#ask" for e in events)


def test_chrome_export_of_a_crash(kv_trace: Path) -> None:
    """The kvstore's restart stays on its agent's one track; the crash is a failed span."""
    document = chrome_trace(kv_trace, imports=False)
    assert list(check_trace_events(document).values()) == ["kv:1 (kv)"]
    crash = [e for e in document["traceEvents"] if e.get("name") == "crash"]
    assert crash[0]["args"]["ok"] is False
    assert crash[0]["args"]["error"]["kind"] == "out_of_fuel"
    assert not any(e["ph"] == "i" for e in document["traceEvents"])


def _write_chains(path: Path, agents: int, chains: list[list[int]]) -> int:
    """A trace of ``agents`` agents where each chain [a, b, c] is a asking b asking c; the
    number of asks written."""
    asks = 0
    steps = dict.fromkeys(range(1, agents + 1), 0)

    def step(i: int) -> int:
        steps[i] += 1
        return steps[i]

    with TraceWriter(path, {}) as writer:
        for i in range(1, agents + 1):
            writer.append(
                {"k": "instance", "i": i, "component": _SHA, "budget": _BUDGET, "a": f"t:{i}"}
            )
        for n, chain in enumerate(chains):
            message = {"name": "go", "body": bytes([0xA1, 0x61, 0x6E, n % 24])}
            sender = "host"
            for i in chain:
                writer.append(
                    {
                        "k": "call",
                        "i": i,
                        "s": step(i),
                        "fn": "handle",
                        "budget": _BUDGET,
                        "args": [sender, message],
                        "a": f"t:{i}",
                    }
                )
                sender = f"t:{i}"
            for depth in range(len(chain) - 1, -1, -1):
                i = chain[depth]
                if depth + 1 < len(chain):
                    asks += 1
                    writer.append(
                        {
                            "k": "import",
                            "i": i,
                            "s": step(i),
                            "if": "mighty:agent/host",
                            "fn": "ask",
                            "args": [f"t:{chain[depth + 1]}", message, 1000],
                            "res": Ok({"name": "reply", "body": b""}),
                            "out": "ok",
                            "a": f"t:{i}",
                        }
                    )
                writer.append(
                    {
                        "k": "export",
                        "i": i,
                        "s": step(i),
                        "fn": "handle",
                        "res": Ok(None),
                        "ok": True,
                        "error": None,
                        "a": f"t:{i}",
                    }
                )
    return asks


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda agents: st.tuples(
            st.just(agents),
            st.lists(
                st.permutations(range(1, agents + 1)).flatmap(
                    lambda order: st.integers(1, len(order)).map(lambda k: list(order[:k]))
                ),
                max_size=6,
            ),
        )
    )
)
def test_any_run_exports_to_valid_trace_events(
    tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, list[list[int]]]
) -> None:
    """Any run of ask chains exports to valid trace events: a track per agent, slices that
    nest, one flow per ask, each from the asker's slice to the callee's."""
    agents, chains = shape
    path = tmp_path_factory.mktemp("chains") / "t.trace"
    asks = _write_chains(path, agents, chains)
    document = chrome_trace(path)
    tracks = check_trace_events(document)
    assert sorted(tracks.values()) == sorted(f"t:{i}" for i in range(1, agents + 1))
    assert sum(1 for e in document["traceEvents"] if e["ph"] == "s") == asks
    spans = sum(1 for e in document["traceEvents"] if e["ph"] == "X")
    assert spans == sum(len(chain) for chain in chains)


def _chromium() -> str | None:
    for name in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _browse(page: Path, *flags: str) -> str:
    browser = _chromium()
    assert browser is not None, "no Chromium: apt-get install chromium-headless-shell"
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


@pytest.mark.browser
def test_html_timeline_renders_in_chromium(relay_trace: Path, tmp_path: Path) -> None:
    """The page renders a track per agent in Chromium, a click shows the message's body and
    the imports made inside; a screenshot is kept in the test's directory."""
    page = tmp_path / "relay.html"
    result = CliRunner().invoke(main, ["trace", "show", str(relay_trace), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "http" not in page.read_text().split("<script>")[1]  # no network: all inline
    # Boxes are numbered track by track: span-1 is a's init, span-2 its first relay.
    dom = _browse(page, "--dump-dom", f"{page.as_uri()}#span-2")
    assert dom.count('class="track"') == 3
    for name in ("relay:1 (a)", "relay:2 (b)", "relay:3 (c)"):
        assert f'<div class="label">{name}</div>' in dom
    assert 'data-span="span-2"' in dom
    assert "message relay  (instance 1, step 15" in dom
    assert 'body: {"via":["b","c"],"tag":"first"}' in dom
    assert "mighty:agent/host#ask" in dom
    shot = tmp_path / "relay.png"
    _browse(page, f"--screenshot={shot}", "--window-size=1100,400", f"{page.as_uri()}#span-2")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {shot}")


def test_html_page_escapes_what_it_embeds(kv_trace: Path) -> None:
    """The page's data cannot end its script element, and the title is escaped."""
    text = html_page(kv_trace)
    data = text.split('<script type="application/json" id="data">')[1].split("</script>")[0]
    assert "</" not in data
    assert json.loads(data)["tracks"][0]["name"] == "kv:1 (kv)"


def test_a_run_without_agents_draws_a_track_per_instance(
    wat: Callable[[str], bytes], tmp_path: Path
) -> None:
    """A plain `mty call` trace: one track per instance, a span per export call."""
    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (2,)), ("run", (1,))])
    document = chrome_trace(trace)
    assert list(check_trace_events(document).values()) == ["instance 1"]
    spans = [e for e in document["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["args"]["ok"]) for e in spans] == [("run", True), ("run", True)]
    assert "instance 1" in html_page(trace)


def test_the_page_lists_a_bounded_number_of_imports(tmp_path: Path) -> None:
    """A call with 250 imports: the page lists 200 of them and counts the rest."""
    path = tmp_path / "many.trace"
    with TraceWriter(path, {}) as writer:
        writer.append({"k": "instance", "i": 1, "component": _SHA, "budget": _BUDGET})
        writer.append({"k": "call", "i": 1, "s": 1, "fn": "run", "args": [], "budget": _BUDGET})
        for n in range(250):
            writer.append(
                {
                    "k": "import",
                    "i": 1,
                    "s": n + 2,
                    "if": "wasi:random/random",
                    "fn": "get-random-u64",
                    "args": [],
                    "res": n,
                    "out": "ok",
                }
            )
        writer.append(
            {"k": "export", "i": 1, "s": 252, "fn": "run", "res": 0, "ok": True, "error": None}
        )
    (span,) = timeline_data(path)["tracks"][0]["spans"]
    assert len(span["imports"]) == 200 and span["more_imports"] == 50
