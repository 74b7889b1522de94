"""Code mode: one run's own limits, lower than its sandbox's, on pooled instances."""

from __future__ import annotations

from pathlib import Path

import pytest

from mighty._errors import BadInput
from mighty.sandbox import Limits, Sandbox


def test_a_run_can_be_held_tighter_and_the_next_is_not(interpreter: object) -> None:
    """Each lowered field bites in its run; the pooled instance after it has the full limits."""

    def ping() -> int:
        """One."""
        return 1

    with Sandbox(tools=[ping], pool=2) as box:
        full = box.limits
        hog = "x = bytearray(60 << 20)\nlen(x)"
        assert box.run(hog).ok
        tight = box.run(hog, limits=full.replace(memory=48 << 20))
        assert tight.error is not None
        assert tight.error.kind == "out_of_memory"
        spin = box.run("while True: pass", limits=full.replace(timeout=0.2))
        assert spin.error is not None
        assert spin.error.kind in ("deadline_exceeded", "out_of_fuel")
        fuel = box.run("sum(range(10**6))", limits=full.replace(fuel=10**6))
        assert fuel.error is not None
        assert fuel.error.kind == "out_of_fuel"
        calls = box.run("[ping() for _ in range(5)]", limits=full.replace(tool_calls=3))
        assert calls.error is not None
        assert calls.error.kind == "tool_limit"
        assert calls.usage.tool_calls == 3
        shown = box.run("print('z' * 100)", limits=full.replace(output=10))
        assert shown.ok
        assert shown.stdout == "z" * 10
        artifact = shown.artifact("stdout")
        assert artifact is not None
        assert artifact.size == 101
        # The same pool, full limits again.
        again = box.run("[ping() for _ in range(50)]\nprint('z' * 100)\nlen(bytearray(60 << 20))")
        assert again.ok, again.error
        assert again.stdout == "z" * 100 + "\n"
        assert again.usage.tool_calls == 50


@pytest.mark.timing
def test_a_run_cannot_loosen_its_sandboxs_limits(interpreter: object) -> None:
    """A field above the sandbox's is BadInput naming it, before any instance is used."""
    with Sandbox(limits=Limits(timeout=60.0), pool=0) as box:
        with pytest.raises(BadInput, match=r"timeout=120\.0 \(the sandbox's is 60\.0\)"):
            box.run("1", limits=box.limits.replace(timeout=120.0))
        with pytest.raises(BadInput, match="artifact"):
            box.run("1", limits=box.limits.replace(artifact=box.limits.artifact + 1))
        with pytest.raises(BadInput, match="must be a Limits"):
            box.run("1", limits={"timeout": 0.5})  # type: ignore[arg-type]
        assert box.run("1", limits=box.limits.replace(timeout=30.0)).value == 1


def test_recorded_runs_with_lower_limits_replay_exactly(
    interpreter: object, tmp_path: Path
) -> None:
    """A recorded run under its own lower output limits (cut, and flooded past them) replays."""
    from mighty.trace import replay_trace

    with Sandbox(pool=0) as box:
        lower = box.limits.replace(output=10, artifact=100)
        for index, code in enumerate(["print('x' * 50)", "while True: print('x' * 30)"]):
            trace = tmp_path / f"run{index}.bin"
            result = box.run(code, record=trace, limits=lower)
            assert result.ok is (index == 0)
            assert result.stdout == "x" * 10
            assert replay_trace(trace).instances[0].exports == 1
