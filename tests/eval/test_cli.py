"""`mty eval` end to end on the example (JUnit too), bad suite files, `mty reload --verify`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty.cli import main
from mighty.control import request
from tests.eval.conftest import EXAMPLE


def mty() -> list[str]:
    """The `mty` command of this environment."""
    script = Path(sys.executable).parent / "mty"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mighty.cli"]


@pytest.mark.slow
def test_mty_eval_runs_the_example_as_written(
    tmp_path: Path, example_wasm: dict[str, Path]
) -> None:
    """The documented command: a table, evidence for the two failing cells, JUnit with 5 cases."""
    junit = tmp_path / "eval.xml"
    done = subprocess.run(
        [*mty(), "eval", "examples/eval/suite.toml", "--junit", str(junit), "--workers", "2"],
        cwd=EXAMPLE.parents[1],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 1, done.stderr  # two cells fail on purpose
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["CASE", "MEMBER", "VERDICT"]
    rows = {tuple(line.split()[:3]) for line in lines[1:6]}
    assert rows == {
        ("assistant-traffic", "assistant", "pass"),
        ("assistant-traffic", "refactor", "pass"),
        ("assistant-traffic", "regression", "fail"),
        ("trip-plan", "plan-b", "pass"),
        ("trip-plan", "plan-c", "fail"),
    }
    assert '+    "answer": "Sunny",' in done.stdout
    assert '- weather({"city":"Oslo"})' in done.stdout
    assert lines[-1].startswith("5 cells: 3 pass, 2 fail, 0 diverged, 0 error")
    assert "Loading weights" not in done.stderr
    tree = ET.parse(junit).getroot()
    cases = tree.findall("./testsuite/testcase")
    assert len(cases) == 5
    failed = {(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None}
    assert failed == {("assistant-traffic", "regression"), ("trip-plan", "plan-c")}
    assert tree.get("failures") == "2"


@pytest.mark.slow
def test_mty_eval_json_and_exit_zero_when_all_pass(
    tmp_path: Path, example_wasm: dict[str, Path]
) -> None:
    """Every cell passing exits 0; --json prints one object with every cell."""
    suite = tmp_path / "suite.toml"
    suite.write_text(
        f"""
[[case]]
name = "traffic"
trace = "{EXAMPLE / "traces" / "assistant.bin"}"
agent = "assistant"

[[member]]
name = "v1"
wasm = "{example_wasm["assistant"]}"

[[member]]
name = "refactor"
wasm = "{example_wasm["assistant_refactor"]}"

[[compare]]
name = "equal"
on = "messages"
"""
    )
    result = CliRunner().invoke(main, ["eval", str(suite), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert [c["verdict"] for c in report["cells"]] == ["pass", "pass"]
    assert all(c["fuel"] > 0 for c in report["cells"])


BAD = [
    ("[[case]\nname = 1", "not valid TOML"),
    ('[[case]]\nname = "a"\n[[member]]\nname = "m"\nwasm = "x.wasm"', "case #1: missing trace"),
    ('bogus = 1\n[[case]]\nname = "a"\ntrace = "t"', "unknown key 'bogus'"),
    ('[[compare]]\nname = "nope"', "unknown comparator 'nope'"),
    ('[[compare]]\nname = "semantic"\nthreshold = 1.5', "threshold must be in [0, 1]"),
    ('policy = "sometimes"', "policy must be 'strict' or 'live'"),
    ('[[case]]\nname = "a"\ntrace = "t"\ncompare = ["x"]', "no comparator with id 'x'"),
    (
        '[[case]]\nname = "a"\ntrace = "t"\n[[member]]\nname = "m"\nwasm = "a"\ncode = "b"',
        "exactly one",
    ),
    ('[[case]]\nname = "a"\ntrace = "t"', "no [[member]]"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_malformed_suite_is_one_line_and_exit_2(tmp_path: Path, text: str, message: str) -> None:
    """A malformed suite file is one line naming the problem, exit 2, no traceback."""
    suite = tmp_path / "suite.toml"
    suite.write_text(text)
    result = CliRunner().invoke(main, ["eval", str(suite)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_missing_suite_file_is_exit_2(tmp_path: Path) -> None:
    """A suite file that does not exist is exit 2 with one line."""
    result = CliRunner().invoke(main, ["eval", str(tmp_path / "none.toml")])
    assert result.exit_code == 2
    assert "no such file" in result.stderr.lower()


def _cases_and_members(cases: int, members: int) -> str:
    return "".join(
        f'[[case]]\nname = "c{i}"\ntrace = "t{i}.bin"\n' for i in range(cases)
    ) + "".join(f'[[member]]\nname = "m{i}"\ncode = "p.py"\n' for i in range(members))


@pytest.mark.parametrize(
    ("code", "message"),
    [("/dev/zero", "a device, not a regular file"), ("fifo", "a FIFO, not a regular file")],
)
def test_a_member_program_that_is_not_a_file_is_refused_at_once(
    tmp_path: Path, code: str, message: str
) -> None:
    """code naming /dev/zero or a FIFO is one line, exit 2: nothing read, nothing waited on."""
    os.mkfifo(tmp_path / "fifo")
    suite = tmp_path / "suite.toml"
    suite.write_text(f'[[case]]\nname = "a"\ntrace = "t"\n[[member]]\nname = "m"\ncode = "{code}"')
    result = CliRunner().invoke(main, ["eval", str(suite)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_suite_file_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    """The suite path itself naming a FIFO is refused, not opened and waited on."""
    os.mkfifo(tmp_path / "suite.toml")
    result = CliRunner().invoke(main, ["eval", str(tmp_path / "suite.toml")])
    assert result.exit_code == 2
    assert "FIFO" in result.stderr


def test_too_many_cells_are_refused(tmp_path: Path) -> None:
    """2,000 cases x 2,000 members (4 M cells from a small file) is refused before any runs."""
    (tmp_path / "p.py").write_text("result = 1")
    suite = tmp_path / "suite.toml"
    suite.write_text(_cases_and_members(2000, 2000))
    result = CliRunner().invoke(main, ["eval", str(suite)])
    assert result.exit_code == 2, result.output
    assert "4000000 cells" in result.stderr


def test_deeply_nested_toml_is_one_line(tmp_path: Path) -> None:
    """A TOML array nested 100,000 deep is 'nested too deeply', not an internal error."""
    suite = tmp_path / "suite.toml"
    suite.write_text("a = " + "[" * 100_000 + "]" * 100_000)
    result = CliRunner().invoke(main, ["eval", str(suite)])
    assert result.exit_code == 2, result.output
    assert "nested too deeply" in result.stderr
    assert "internal" not in result.stderr.lower()


def test_a_trace_that_is_a_fifo_is_an_error_cell_not_a_hang(tmp_path: Path) -> None:
    """A case whose trace is a FIFO ends as an error cell naming it (the run is bounded by
    the test's own timeout, never by the FIFO)."""
    os.mkfifo(tmp_path / "t.bin")
    suite = tmp_path / "suite.toml"
    suite.write_text('[[case]]\nname = "a"\ntrace = "t.bin"\n[[member]]\nname = "m"\ncode = "p.py"')
    (tmp_path / "p.py").write_text("result = 1")
    done = subprocess.run(
        [*mty(), "eval", str(suite), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = json.loads(done.stdout)
    assert [c["verdict"] for c in report["cells"]] == ["error"]
    assert "not a regular file" in report["cells"][0]["reason"]


@pytest.mark.slow
def test_mty_reload_verify_refuses_a_regression_and_swaps_a_refactor(
    tmp_path: Path, example_wasm: dict[str, Path]
) -> None:
    """Against a running `mty run`: the regression is refused naming its cell, nothing is
    touched; the refactor passes the suite and is swapped in."""
    suite = tmp_path / "verify.toml"
    suite.write_text(
        f'[[case]]\nname = "traffic"\ntrace = "{EXAMPLE / "traces" / "assistant.bin"}"\n'
        f'[[member]]\nname = "placeholder"\nwasm = "{example_wasm["assistant"]}"\n'
    )
    sock = tmp_path / "control.sock"
    env = {**os.environ, "RUNTIME_CONTROL_SOCK": str(sock)}
    proc = subprocess.Popen(
        [*mty(), "run", str(EXAMPLE / "app.toml"), "--keep-running", "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while not sock.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the control socket never appeared"
            time.sleep(0.1)

        def settled() -> bool:
            agents = request(sock, "status")["agents"]
            return any(a["name"] == "assistant" and a["handled"] == 3 for a in agents)

        while not settled():  # the start messages are handled
            assert time.monotonic() < deadline, "the start messages were never handled"
            time.sleep(0.1)
        before = request(sock, "status")
        runner = CliRunner(env={"RUNTIME_CONTROL_SOCK": str(sock)})
        refused = runner.invoke(
            main,
            [
                "reload",
                "assistant",
                "--from",
                str(example_wasm["assistant_regression"]),
                "--verify",
                str(suite),
                "--json",
            ],
        )
        assert refused.exit_code == 1, refused.output
        error = json.loads(refused.stdout)["error"]
        assert error["kind"] == "verify_failed"
        assert "traffic: fail: equal(result): result differs" in error["message"]
        assert request(sock, "status") == before  # nothing was paused or swapped
        swapped = runner.invoke(
            main,
            [
                "reload",
                "assistant",
                "--from",
                str(example_wasm["assistant_refactor"]),
                "--verify",
                str(suite),
                "--json",
            ],
        )
        assert swapped.exit_code == 0, swapped.output
        assert len(json.loads(swapped.stdout)["result"]["agents"]) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()
