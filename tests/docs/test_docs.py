"""Every code block of README.md and docs/*.md runs as written (see tests/docs/_markdown.py).

Each page runs in its own working directory holding copies of ``examples/`` and ``guests/``, as
a reader in a fresh checkout would: paths in the docs are relative to the repository root. The
blocks of a page run in order and share that directory, so a component built by one block is
called by the next.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs._markdown import Block, blocks, expected_output, matches

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Pages another change is fixing; strict xfail, so the entry must go once the page passes.
PENDING: dict[str, str] = {}
"""Pages known not to run yet, with why (each entry fails once its page passes)."""

_COMMAND_TIMEOUT = 900.0  # a cold agent build is a minute; four at once on two cores, more


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory laid out like the checkout's root, for one page's blocks."""
    ignore = shutil.ignore_patterns(".mighty", "*.wasm", "__pycache__", "*.bin")
    for name in ("examples", "guests"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=ignore)
    return tmp_path


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _commands(code: str) -> list[str]:
    """The block's shell commands: one per line, ``\\`` continuations joined, comments dropped."""
    commands: list[str] = []
    pending = ""
    for raw in code.splitlines():
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(line)
    return commands


def _run_sh(block: Block, cwd: Path) -> None:
    for command in _commands(block.code):
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=cwd,
            env=_environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT,
            check=False,
        )
        expected = expected_output(command)
        # A guest failure is exit status 1 by the README's contract; the docs show it as
        # `{"ok": false, ...}` output.
        status = 1 if expected is not None and expected.startswith('{"ok": false') else 0
        context = f"{block.where}: `{command}` exited {done.returncode}\n{done.stdout}{done.stderr}"
        assert done.returncode == status, context
        if expected is not None:
            assert matches(expected, done.stdout), f"{context}\nexpected: {expected}"


def _run_python(block: Block, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(cwd)
    code = compile(block.code, block.where, "exec")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(code, {"__name__": "__docs__"})
    printed = output.getvalue()
    position = 0
    for line in block.code.splitlines():
        expected = expected_output(line)
        if expected is None or not line.lstrip().startswith("print("):
            continue
        rest = printed[position:]
        assert matches(expected, rest), f"{block.where}: expected {expected!r} in {rest!r}"
        position += rest.find(expected.split("...")[0].strip())


def _run(block: Block, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.mark == "not run":
        assert block.value, f"{block.where}: `not run` needs a reason"
        return
    if block.mark == "file":
        target = cwd / block.value
        assert block.value, f"{block.where}: `file` needs a path"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code, encoding="utf-8")
        return
    if block.lang == "python":
        _run_python(block, cwd, monkeypatch)
    elif block.lang in ("sh", "bash", "shell"):
        _run_sh(block, cwd)
    else:
        pytest.fail(
            f"{block.where}: a {block.lang or 'plain'} block is neither run nor marked; put "
            "`<!-- file: PATH -->` or `<!-- not run: REASON -->` on the line before it"
        )


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_page_runs_as_written(
    page: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Every code block of the page runs (or is marked with a reason) and prints what it says."""
    if page.name in PENDING:
        request.applymarker(pytest.mark.xfail(reason=PENDING[page.name], strict=True))
    for block in blocks(page):
        _run(block, workdir, monkeypatch)


def test_collector_reads_marks_and_expectations(tmp_path: Path) -> None:
    """The collector finds each fence, the mark before it and the `# ->` output on a line."""
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- not run: starts a server -->\n\n```sh\nmty serve\n```\n\n"
        "<!-- file: wit/x.wit -->\n```wit\npackage a:b;\n```\n\n"
        "```python\nprint(1)  # -> 1\n```\n",
        encoding="utf-8",
    )
    found = blocks(page)
    assert [(b.line, b.lang, b.mark, b.value) for b in found] == [
        (5, "sh", "not run", "starts a server"),
        (10, "wit", "file", "wit/x.wit"),
        (14, "python", None, ""),
    ]
    assert expected_output(found[2].code.splitlines()[0]) == "1"
    assert matches(
        '{"ok": false, "error": {"kind": "x", ...}}',
        '{"ok": false, "error": {"kind": "x", "message": "m"}}',
    )
    assert not matches("b ... a", "a b")


def test_unmarked_block_of_other_language_fails(tmp_path: Path) -> None:
    """A toml block with no mark is an error that names the two marks to choose from."""
    page = tmp_path / "page.md"
    page.write_text("```toml\na = 1\n```\n", encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match="neither run nor marked"):
        _run(blocks(page)[0], tmp_path, pytest.MonkeyPatch())
