"""Tests for which files a build reads, its digest, and world discovery (no builds)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mighty.build._inputs import build_inputs, compute_digest, find_worlds, input_files

WIT = """\
package demo:app;

world app {
  export run: func() -> string;
}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "wit").mkdir(parents=True)
    (root / "wit" / "app.wit").write_text(WIT)
    (root / "handler.py").write_text("import helper\n")
    (root / "helper.py").write_text("X = 1\n")
    return root


def digest(
    root: Path,
    *,
    world: str = "app",
    module: str = "handler",
    roots: list[Path] | None = None,
    wit: Path | None = None,
    tool_version: str = "0.25.1",
) -> str:
    return compute_digest(
        module=module,
        roots=roots if roots is not None else [root],
        wit=wit if wit is not None else root / "wit",
        world=world,
        tool_version=tool_version,
    )


def test_digest_is_stable(project: Path) -> None:
    """The same inputs give the same digest."""
    assert digest(project) == digest(project)


def test_one_byte_in_a_module_changes_digest(project: Path) -> None:
    """Changing one byte of any module under the source directory changes the digest."""
    before = digest(project)
    (project / "helper.py").write_text("X = 2\n")
    assert digest(project) != before


def test_world_name_and_wit_files_are_in_the_key(project: Path) -> None:
    """The world name, any .wit file (deps too), the module and the tool version are hashed."""
    base = digest(project)
    assert digest(project, world="other") != base
    assert digest(project, module="helper") != base
    assert digest(project, tool_version="0.26.0") != base
    wit_dir = project.parent / "elsewhere-wit"
    shutil.copytree(project / "wit", wit_dir)
    same_wit = digest(project, wit=wit_dir)
    (wit_dir / "deps").mkdir()
    (wit_dir / "deps" / "x.wit").write_text("package dep:x;\n")
    assert digest(project, wit=wit_dir) != same_wit


def test_extra_python_path_is_in_the_key(project: Path, tmp_path: Path) -> None:
    """Files in an extra -p directory, and the order of the directories, are hashed."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "util.py").write_text("Y = 1\n")
    (project / "handler.py").write_text("import helper\nimport util\n")
    with_lib = digest(project, roots=[project, lib])
    assert with_lib != digest(project)
    (lib / "util.py").write_text("Y = 2\n")
    assert digest(project, roots=[project, lib]) != with_lib
    assert digest(project, roots=[lib, project]) != digest(project, roots=[project, lib])


def test_caches_bytecode_and_output_are_ignored(project: Path) -> None:
    """__pycache__, .git, *.pyc, unrelated binaries and the build's output do not count."""
    before = digest(project)
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "handler.cpython-314.pyc").write_bytes(b"\0")
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref: x\n")
    (project / "stale.pyc").write_bytes(b"\0")
    (project / "out.wasm").write_bytes(b"\0asm")
    (project / "logo.png").write_bytes(b"\x89PNG")
    assert digest(project) == before


def test_moving_the_project_keeps_the_digest(project: Path, tmp_path: Path) -> None:
    """Paths are hashed relative to their root, so a moved project hits the same cache entry."""
    moved = tmp_path / "moved"
    shutil.copytree(project, moved)
    assert digest(moved) == digest(project)


def test_input_files_are_sorted_relative_paths(project: Path) -> None:
    """input_files lists (relative posix path, path) pairs in a stable order."""
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    names = [rel for rel, _ in input_files(project, suffixes=frozenset({".py"}))]
    assert names == ["handler.py", "helper.py", "pkg/__init__.py"]


def test_find_worlds_ignores_comments_and_deps(tmp_path: Path) -> None:
    """Worlds are read from the package's own .wit files, not comments or deps/."""
    (tmp_path / "deps").mkdir()
    (tmp_path / "deps" / "d.wit").write_text("package d:d;\nworld dep-world {}\n")
    (tmp_path / "a.wit").write_text(
        "package x:y;\n/// world in-doc {\n/* world in-block { */\n"
        "world first {\n  export f: func();\n}\ninterface i { g: func(); }\nworld second-one {}\n"
    )
    assert find_worlds(tmp_path) == ["first", "second-one"]
    assert find_worlds(tmp_path / "a.wit") == ["first", "second-one"]


def test_find_worlds_in_the_example() -> None:
    """The hello example defines exactly the world `hello`."""
    example_wit = Path(__file__).parents[2] / "examples" / "hello" / "wit"
    assert find_worlds(example_wit) == ["hello"]


def test_unrelated_files_do_not_change_the_digest(project: Path) -> None:
    """A manifest, a README, data and another handler's module beside the handler do not count."""
    before = digest(project)
    (project / "mighty.toml").write_text('[agents.a]\nsource = "handler.py"\n')
    (project / "README.md").write_text("hello\n")
    (project / "other_handler.py").write_text("import helper\nX = 3\n")
    (project / "data.json").write_text("{}\n")
    assert digest(project) == before
    (project / "mighty.toml").write_text('[agents.a]\nsource = "handler.py"\nfuel = 5\n')
    assert digest(project) == before


def test_imported_modules_count_transitively(project: Path) -> None:
    """A module imported by an imported module counts; so does every file of a package."""
    (project / "helper.py").write_text("from deep import VALUE\n")
    (project / "deep.py").write_text("VALUE = 1\n")
    before = digest(project)
    (project / "deep.py").write_text("VALUE = 2\n")
    assert digest(project) != before
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "sub.py").write_text("A = 1\n")
    (project / "handler.py").write_text(
        "import helper\nimport importlib\nimportlib.import_module('pkg')\n"
    )
    with_pkg = digest(project)
    (project / "pkg" / "sub.py").write_text("A = 2\n")
    assert digest(project) != with_pkg


def test_build_inputs_follow_the_roots_in_order(project: Path, tmp_path: Path) -> None:
    """A name resolves in the first root that has it; stdlib and missing names are not inputs."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper.py").write_text("SHADOWED = 1\n")
    (lib / "extra.py").write_text("")
    (project / "handler.py").write_text("import os, json, helper, extra, nowhere\n")
    found = [(i, rel) for i, rel, _ in build_inputs("handler", [project, lib])]
    assert found == [(0, "handler.py"), (0, "helper.py"), (1, "extra.py")]


def test_a_syntax_error_is_still_an_input(project: Path) -> None:
    """A module that does not parse is hashed (the build reports it); its imports are not known."""
    (project / "handler.py").write_text("import helper\ndef (:\n")
    assert [rel for _, rel, _ in build_inputs("handler", [project])] == ["handler.py"]
