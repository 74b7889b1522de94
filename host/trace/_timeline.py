"""Traces as timelines: Chrome trace-event JSON (Perfetto, chrome://tracing) of a recorded run.

``chrome_trace(path)`` turns a trace into the trace-event format's JSON object form
(``{"traceEvents": [...]}``): one track (a ``tid`` with a ``thread_name``) per agent, or per
instance for a run without agents; a complete event (``ph: "X"``) per export call, a message's
name, sender, body and reply (decoded from CBOR) in its ``args``; an instant (``ph: "i"``)
per import; and a flow (``ph: "s"`` on the asker's track, ``"f"`` with ``bp: "e"`` on the
callee's) from each ask or send to the handling of that message.

The time axis is the order of the run, not wall time: a trace records no clock readings of its
own (only those the guest asked for, which are the guest's inputs), so an event's ``ts`` is the
position of its record in the trace, one microsecond a record. Spans then nest and line up
across agents exactly as the run interleaved them; their widths say how many records (imports,
nested messages) a call made, not how long it took. Rejected: fuel as the clock (each
instance's fuel restarts at every call and agents run in parallel, so fuel of two agents is not
one axis), and the guest's own clock imports (a guest that never reads the clock would have
none, and a replayed clock is what the guest was told, not when things ran).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from mighty.abi import Ok
from mighty.trace._model import (
    InstanceInfo,
    Message,
    RunModel,
    decoded,
    result_text,
)
from mighty.trace._replay import recorded_source

__all__ = [
    "chrome_trace",
    "html_page",
    "timeline_data",
    "write_chrome_trace",
    "write_html",
]

_PID = 1
_PAGE_IMPORTS = 200
"""Imports listed per span on the HTML page (the rest are counted)."""
_ARG_CHARS = 2000


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON can carry it (bytes by size and head, anything else by repr)."""
    if depth > 16:
        return repr(value)[:200]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray):
        return {"bytes": len(value), "head": bytes(value[:16]).hex()}
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value[:64]]
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in list(value.items())[:64]}
    return repr(value)[:200]


def _arg(value: Any) -> Any:
    text = json.dumps(_plain(value), default=repr)
    return _plain(value) if len(text) <= _ARG_CHARS else text[: _ARG_CHARS - 3] + "..."


class _Tracks:
    """Which track (``tid``) each instance draws on: one per agent, else one per instance."""

    def __init__(self, model: RunModel) -> None:
        self.tid: dict[int, int] = {}
        self.names: dict[int, str] = {}
        by_agent: dict[str, int] = {}
        for info in model.instances.values():
            key = info.agent
            if key is not None and key in by_agent:
                self.tid[info.instance] = by_agent[key]
                continue
            tid = len(self.names) + 1
            self.tid[info.instance] = tid
            self.names[tid] = _track_name(info)
            if key is not None:
                by_agent[key] = tid


def _track_name(info: InstanceInfo) -> str:
    if info.agent is None:
        return f"instance {info.instance}"
    return f"{info.agent} ({info.name})" if info.name and info.name != info.agent else info.agent


def _source_arg(record: dict[str, Any]) -> dict[str, str]:
    """``{"source": "file:line in function"}`` for an import that recorded one, else ``{}``."""
    source = recorded_source(record.get("src"))
    if source is None:
        return {}
    return {"source": f"{source[0]}:{source[1]} in {source[2]}"}


def chrome_trace(path: str | Path, *, imports: bool = True) -> dict[str, Any]:
    """The trace at ``path`` as a Chrome trace-event JSON object (see the module docstring);
    ``imports=False`` leaves the import instants out (a long run's file is mostly those)."""
    model = RunModel(path)
    tracks = _Tracks(model)
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "tid": 0, "args": {"name": str(path)}}
    ]
    for tid, name in tracks.names.items():
        events.append(
            {"name": "thread_name", "ph": "M", "pid": _PID, "tid": tid, "args": {"name": name}}
        )
        events.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": _PID,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    for info in model.instances.values():
        events.extend(_instance_events(model, info, tracks.tid[info.instance], imports))
    events.extend(_flows(model, tracks))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": str(path),
            "time axis": "record order: one microsecond a record (a trace holds no wall time)",
        },
    }


def _instance_events(
    model: RunModel, info: InstanceInfo, tid: int, imports: bool
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    messages = {m.offset: m for m in info.messages}
    open_call: dict[str, Any] | None = None
    for record in info.records:
        kind = record["k"]
        ts = model.rank(record["@"])
        if kind == "call":
            open_call = record
        elif kind == "export" and open_call is not None:
            start = model.rank(open_call["@"])
            events.append(
                _span(info, open_call, record, messages.get(open_call["@"]), start, ts, tid)
            )
            open_call = None
        elif kind == "import" and imports:
            events.append(
                {
                    "name": f"{record['if']}#{record['fn']}",
                    "cat": "import",
                    "ph": "i",
                    "s": "t",
                    "ts": ts,
                    "pid": _PID,
                    "tid": tid,
                    "args": {
                        "instance": info.instance,
                        "step": record["s"],
                        "args": _arg(record["args"]),
                        "result": _arg(_readable(record["res"])),
                        "outcome": record["out"],
                        **_source_arg(record),
                    },
                }
            )
    if open_call is not None:
        # The trace ends inside this call (a crash, a cut file): draw it to the end.
        start = model.rank(open_call["@"])
        end = max(start, model.rank(info.offsets[-1]))
        events.append(_span(info, open_call, None, messages.get(open_call["@"]), start, end, tid))
    return events


def _readable(value: Any) -> Any:
    """A message (or a result holding one) with its body decoded."""
    if isinstance(value, Ok):
        return {"ok": _readable(value.value)}
    if isinstance(value, dict) and "name" in value and "body" in value:
        return {"name": value["name"], "body": decoded(value["body"])}
    if isinstance(value, list):
        return [_readable(v) for v in value]
    return value


def _span(
    info: InstanceInfo,
    call: dict[str, Any],
    end: dict[str, Any] | None,
    message: Message | None,
    start: int,
    stop: int,
    tid: int,
) -> dict[str, Any]:
    args: dict[str, Any] = {"instance": info.instance, "step": call["s"]}
    if message is not None:
        name = f"{message.name}"
        args.update(sender=message.sender, body=_arg(decoded(message.body)))
        if end is not None:
            args["reply"] = result_text(end["res"], _ARG_CHARS) if end["ok"] else None
    else:
        name = str(call["fn"])
        args["args"] = _arg(call["args"])
    if end is None:
        args["ended"] = "the trace ends inside this call"
    else:
        args.update(ok=end["ok"], fuel=end.get("fuel"))
        if not end["ok"]:
            args["error"] = _arg(end["error"])
    return {
        "name": name,
        "cat": "message" if message is not None else "export",
        "ph": "X",
        "ts": start,
        "dur": max(stop - start, 1),
        "pid": _PID,
        "tid": tid,
        "args": args,
    }


def _flows(model: RunModel, tracks: _Tracks) -> list[dict[str, Any]]:
    """A flow from each ask or send to the handling of its message (matched by sender,
    message and order: an ask's record comes after its callee's handling ends, a send's before
    its handling starts)."""
    handled = sorted(
        (m for info in model.instances.values() for m in info.messages), key=lambda m: m.offset
    )
    used: set[int] = set()
    events: list[dict[str, Any]] = []
    for info in model.instances.values():
        if info.agent is None:
            continue
        for record in info.records:
            if record["k"] != "import" or record.get("fn") not in ("ask", "send"):
                continue
            args = record["args"]
            if len(args) < 2 or not isinstance(args[1], dict):
                continue
            at = record["@"]
            candidates = [
                m
                for m in handled
                if m.offset not in used
                and m.sender == info.agent
                and m.name == args[1].get("name")
                and m.body == args[1].get("body")
                and (m.offset > at if record["fn"] == "send" else m.offset < at)
            ]
            if not candidates:
                continue
            target = candidates[0] if record["fn"] == "send" else candidates[-1]
            used.add(target.offset)
            flow = len(events) // 2 + 1
            start_ts = model.rank(at) if record["fn"] == "send" else model.rank(target.offset)
            name = f"{record['fn']} {target.name}"
            common = {"name": name, "cat": "flow", "id": flow, "pid": _PID}
            events.append({**common, "ph": "s", "ts": start_ts, "tid": tracks.tid[info.instance]})
            events.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "ts": model.rank(target.offset),
                    "tid": tracks.tid[target.instance],
                }
            )
    return events


def write_chrome_trace(path: str | Path, out: str | Path, *, imports: bool = True) -> int:
    """Write :func:`chrome_trace` of ``path`` to ``out``; the number of events written."""
    document = chrome_trace(path, imports=imports)
    Path(out).write_text(json.dumps(document, ensure_ascii=False, default=repr))
    return len(document["traceEvents"])


def timeline_data(path: str | Path) -> dict[str, Any]:
    """What the HTML page draws: a track per agent (per instance without agents), each with
    its export calls as spans (message, sender, body, reply, the imports made inside)."""
    model = RunModel(path)
    tracks = _Tracks(model)
    rows: dict[int, dict[str, Any]] = {
        tid: {"name": name, "spans": []} for tid, name in tracks.names.items()
    }
    for info in model.instances.values():
        row = rows[tracks.tid[info.instance]]
        messages = {m.offset: m for m in info.messages}
        span: dict[str, Any] | None = None
        for record in info.records:
            kind = record["k"]
            if kind == "call":
                message = messages.get(record["@"])
                span = {
                    "start": model.rank(record["@"]),
                    "end": None,
                    "instance": info.instance,
                    "step": record["s"],
                    "name": message.name if message else str(record["fn"]),
                    "message": message is not None,
                    "sender": message.sender if message else None,
                    "body": _arg(decoded(message.body)) if message else _arg(record["args"]),
                    "imports": [],
                }
                row["spans"].append(span)
            elif kind == "import" and span is not None:
                if len(span["imports"]) >= _PAGE_IMPORTS:
                    span["more_imports"] = span.get("more_imports", 0) + 1
                    continue
                span["imports"].append(
                    {
                        "at": model.rank(record["@"]),
                        "name": f"{record['if']}#{record['fn']}",
                        "args": _arg(_readable(record["args"])),
                        "result": _arg(_readable(record["res"])),
                        **_source_arg(record),
                    }
                )
            elif kind == "export" and span is not None:
                span["end"] = model.rank(record["@"])
                span["ok"] = bool(record["ok"])
                span["fuel"] = record.get("fuel")
                span["reply" if record["ok"] else "error"] = _arg(
                    _readable(record["res"]) if record["ok"] else record["error"]
                )
                span = None
        if span is not None:
            span["end"] = model.rank(info.offsets[-1])
            span["error"] = "the trace ends inside this call"
    return {"title": str(path), "records": len(model.records), "tracks": list(rows.values())}


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mighty trace: __TITLE__</title>
<style>
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:16px;margin:0 0 4px}
.note{color:#666;margin-bottom:12px}
.track{display:flex;align-items:center;height:30px;border-bottom:1px solid #eee}
.label{width:180px;flex:none;font-weight:600;overflow:hidden;white-space:nowrap}
.lane{position:relative;flex:1;height:22px;background:#fafafa}
.span{position:absolute;top:2px;height:18px;border-radius:3px;background:#4c8bf5;color:#fff;
 font-size:11px;overflow:hidden;white-space:nowrap;cursor:pointer;padding:0 3px;
 box-sizing:border-box}
.span.export{background:#9aa5b1}
.span.failed{background:#d93f3f}
.span.selected{outline:2px solid #111}
#details{margin-top:14px;padding:8px;border:1px solid #ddd;background:#fcfcfc;white-space:pre-wrap;
 font:12px ui-monospace,monospace;min-height:40px}
</style></head><body>
<h1>__TITLE__</h1>
<div class="note">One row per agent; one box per message handled (grey: other export calls, red:
failed). The axis is the order of the run (record by record), not wall time. Click a box.</div>
<div id="tracks"></div>
<div id="details">(click a message to see its body, reply and imports)</div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const total = Math.max(1, data.records);
const tracks = document.getElementById("tracks");
const details = document.getElementById("details");
let spanIndex = 0;
function show(span, box) {
  for (const other of document.querySelectorAll(".span.selected")) {
    other.classList.remove("selected");
  }
  box.classList.add("selected");
  const lines = [
    (span.message ? "message " : "call ") + span.name + "  (instance " + span.instance +
      ", step " + span.step + ", records " + span.start + "-" + span.end + ")",
  ];
  if (span.sender) lines.push("from: " + span.sender);
  lines.push("body: " + JSON.stringify(span.body));
  if ("reply" in span) lines.push("reply: " + JSON.stringify(span.reply));
  if ("error" in span) lines.push("error: " + JSON.stringify(span.error));
  if (span.fuel !== undefined) lines.push("fuel: " + span.fuel);
  lines.push("imports (" + span.imports.length + "):");
  for (const item of span.imports) {
    lines.push("  #" + item.at + " " + item.name + " " + JSON.stringify(item.args) +
      " -> " + JSON.stringify(item.result) + (item.source ? "  at " + item.source : ""));
  }
  if (span.more_imports) lines.push("  ... and " + span.more_imports + " more");
  details.textContent = lines.join("\\n");
  details.dataset.span = box.id;
}
for (const track of data.tracks) {
  const row = document.createElement("div");
  row.className = "track";
  const label = document.createElement("div");
  label.className = "label";
  label.textContent = track.name;
  const lane = document.createElement("div");
  lane.className = "lane";
  for (const span of track.spans) {
    const box = document.createElement("div");
    box.id = "span-" + (++spanIndex);
    box.className = "span" + (span.message ? "" : " export") +
      (span.ok === false || (!("reply" in span) && "error" in span) ? " failed" : "");
    box.style.left = (100 * (span.start - 1) / total) + "%";
    box.style.width = "max(3px, " + (100 * (span.end - span.start + 1) / total) + "%)";
    box.textContent = span.name;
    box.title = span.name + (span.sender ? " from " + span.sender : "");
    box.addEventListener("click", () => show(span, box));
    lane.appendChild(box);
  }
  row.appendChild(label);
  row.appendChild(lane);
  tracks.appendChild(row);
}
// #span-N selects a box on load, through the same click a person makes.
const wanted = location.hash.slice(1) && document.getElementById(location.hash.slice(1));
if (wanted) wanted.click();
</script></body></html>
"""


def html_page(path: str | Path) -> str:
    """A self-contained HTML page of the run's timeline (no network: data and script inline)."""
    data = json.dumps(timeline_data(path), ensure_ascii=False, default=repr)
    # Inside <script>, "</" would end the element: JSON allows "<\\/" for it.
    data = data.replace("</", "<\\/")
    title = html.escape(str(path))
    return _PAGE.replace("__TITLE__", title).replace("__DATA__", data)


def write_html(path: str | Path, out: str | Path) -> None:
    """Write :func:`html_page` of ``path`` to ``out``."""
    Path(out).write_text(html_page(path), encoding="utf-8")
