"""Re-record the code-mode case: `python examples/eval/record.py` (writes traces/plan.bin).

The agent case is recorded with mty itself:
`mty run examples/eval/app.toml --record examples/eval/traces/assistant.bin`.
"""

from pathlib import Path

from mighty.sandbox import Sandbox

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(HERE))
    import tools

    code = (HERE / "programs" / "plan_a.py").read_text()
    trace = HERE / "traces" / "plan.bin"
    trace.unlink(missing_ok=True)
    with Sandbox(tools=[tools.weather, tools.flights], pool=0) as box:
        result = box.run(code, record=trace)
    print(result.ok, result.value)
