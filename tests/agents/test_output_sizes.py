"""A CPython agent's stdout: one large print is kept up to the cap and counted exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from mighty import Component, MightyError
from mighty.agents import AgentOutput, AgentType, Runtime
from mighty.wasi import DEFAULT_OUTPUT_CAP

ROOT = Path(__file__).resolve().parents[2]
KIB = 1 << 10
MIB = 1 << 20

_SOURCE = """
import sys

from mighty_agent import Agent, export, on


class Printer(Agent):
    @on("print")
    def print_(self, body, sender):
        print("y" * body["size"], file=sys.stderr if body.get("stderr") else sys.stdout)
        return body["size"]


WitWorld = export(Printer)
"""


@pytest.fixture(scope="module")
def printer(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """An SDK agent that prints ``size`` characters on ``print``."""
    from mighty.build import build_component

    tmp = tmp_path_factory.mktemp("printer")
    source = tmp / "printer.py"
    source.write_text(_SOURCE)
    out = tmp / "printer.wasm"
    build_component(
        source, output=out, wit=ROOT / "wit" / "agent", python_path=[ROOT / "guests" / "sdk"]
    )
    return Component.load(out)


@pytest.mark.parametrize("stderr", [False, True])
@pytest.mark.parametrize("size", [64 * KIB - 1, 64 * KIB, 64 * KIB + 1, MIB])
def test_agent_print_is_kept_whole(printer: Component, size: int, stderr: bool) -> None:
    """An agent's print around the old 64 KiB permit reaches its capture and its output whole."""
    seen: list[AgentOutput] = []
    with Runtime(workers=1, on_output=seen.append) as rt:
        rt.register(AgentType("printer", printer))
        address = rt.spawn("printer")
        assert rt.ask(address, "print", {"size": size, "stderr": stderr}) == size
        instance = rt.process(address).instance
        assert instance is not None
        capture = instance.stderr if stderr else instance.stdout
        written = b"y" * size + b"\n"
        stream = "stderr" if stderr else "stdout"
        heard = "".join(line.text for line in seen if line.stream == stream)
        assert heard.encode() == written[:-1]  # lines (cut at MAX_LINE), without the newline
        assert capture.total == len(written)
        assert capture.getvalue() == written[:DEFAULT_OUTPUT_CAP]
        assert capture.truncated == (len(written) > DEFAULT_OUTPUT_CAP)


def test_agent_print_too_large_to_hand_over_fails(printer: Component) -> None:
    """A 50 MiB print fails the message loudly instead of answering with output cut short."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("printer", printer))
        address = rt.spawn("printer")
        with pytest.raises(MightyError, match="too much data"):
            rt.ask(address, "print", {"size": 50 * MIB})
