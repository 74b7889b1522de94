"""`mty replay --agent A --agent B` replays a sub-graph (both agents, every restart of each),
not silently only the last one named; a name the trace lacks is an error (issue 35 #3)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mighty.cli import main
from mighty.trace import ReplayEvent, replay_trace


def _quiet(_message: str) -> None:
    return None


def test_two_agents_replay_together(relay_trace: Path) -> None:
    """--agent a --agent c replays instances 1 and 3 (a and c), each whole."""
    result = CliRunner().invoke(
        main, ["replay", str(relay_trace), "--agent", "a", "--agent", "relay:3", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [i["instance"] for i in report["instances"]] == [1, 3]
    assert all(i["exports"] == 3 for i in report["instances"])  # init and two relays


def test_one_agent_still_alone(relay_trace: Path) -> None:
    """One --agent (a name, an address or an instance number) replays that agent alone."""
    runner = CliRunner()
    for agent in ("b", "relay:2", "2"):
        result = runner.invoke(main, ["replay", str(relay_trace), "--agent", agent, "--json"])
        assert result.exit_code == 0, result.output
        assert [i["instance"] for i in json.loads(result.stdout)["instances"]] == [2]


def test_an_agent_not_in_the_trace_is_an_error(relay_trace: Path) -> None:
    """Naming an agent the trace does not hold fails (exit 2) and lists the agents it has."""
    result = CliRunner().invoke(
        main, ["replay", str(relay_trace), "--agent", "a", "--agent", "zed"]
    )
    assert result.exit_code == 2
    assert "the trace has no agent 'zed' (agents: relay:1, relay:2, relay:3)" in result.stderr


def test_a_sub_graph_in_recorded_order(relay_trace: Path) -> None:
    """b and c replayed together in recorded order: c handles between b's call and b's ask."""
    events: list[ReplayEvent] = []
    replay_trace(
        relay_trace, agent=["b", "c"], observer=events.append, order="recorded", progress=_quiet
    )
    assert {e.agent for e in events} == {"relay:2", "relay:3"}
    story = [(e.agent, e.kind) for e in events if e.function in ("handle", "ask")]
    assert story[:4] == [
        ("relay:2", "call"),
        ("relay:3", "call"),
        ("relay:3", "export"),
        ("relay:2", "import"),
    ]


def test_mty_debug_takes_a_sub_graph(relay_trace: Path) -> None:
    """`mty debug --agent b --agent c` steps through b and c only."""
    result = CliRunner().invoke(
        main,
        ["debug", str(relay_trace), "--agent", "b", "--agent", "c"],
        input="agents\nbreak relay\ncontinue\ncontinue\nquit\n",
    )
    assert result.exit_code == 0, result.output
    handled = [line for line in result.stdout.splitlines() if ": handle relay" in line]
    assert handled[0].endswith(
        '[relay:2]: handle relay {"via": ["c"], "tag": "first"} from relay:1'
    )
    assert handled[1].endswith('[relay:3]: handle relay {"via": [], "tag": "first"} from relay:2')
    assert "[relay:1]" not in result.stdout
