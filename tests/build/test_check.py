"""Export names that cannot link and syntax errors are reported before componentize-py runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.build import ExportNameClash, HandlerSyntaxError, build_component
from mighty.build._check import (
    LINKED_SYMBOLS,
    check_export_names,
    check_syntax,
    world_function_exports,
)

REPO = Path(__file__).parents[2]
BROKEN = REPO / "guests" / "testing" / "broken"

WORLD = """\
package demo:clash;

// export write: func();   (a comment: not an export)
interface api {
  read: func() -> u32;
}

world base {
  export %{name}: func() -> u32;
}

world app {
  export api;
  export inline: interface {
    write: func();
  }
  include base;
  export ok-name: func() -> u32;
}
"""


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh build cache, so nothing is served from an earlier build."""
    path = tmp_path / "cache"
    monkeypatch.setenv("MTY_CACHE_DIR", str(path))
    return path


@pytest.fixture
def no_componentize(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if componentize-py is started at all."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"componentize-py was run: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)


def _project(tmp_path: Path, name: str) -> Path:
    """A handler whose world ``app`` exports ``name`` (through an included world)."""
    root = tmp_path / "proj"
    (root / "wit").mkdir(parents=True)
    (root / "wit" / "app.wit").write_text(WORLD.replace("{name}", name))
    python_name = name.replace("-", "_")
    (root / "handler.py").write_text(
        "import wit_world\n\n\nclass WitWorld(wit_world.WitWorld):\n"
        f"    def {python_name}(self) -> int:\n        return 1\n\n"
        "    def ok_name(self) -> int:\n        return 2\n"
    )
    return root


def test_world_exports_are_the_top_level_functions(tmp_path: Path) -> None:
    """Only the world's own function exports (and an included world's) count, with lines."""
    root = _project(tmp_path, "read")
    found = world_function_exports(root / "wit", "app")
    assert sorted((name, line) for name, _, line in found) == [("ok-name", 18), ("read", 9)]


@pytest.mark.parametrize("name", ["read", "write", "sqrt", "drem"])
def test_clashing_export_is_named_before_componentize_py(
    name: str, tmp_path: Path, no_componentize: None
) -> None:
    """A world exporting read/write/sqrt/drem is an ExportNameClash naming it and the WIT line."""
    root = _project(tmp_path, name)
    with pytest.raises(ExportNameClash) as caught:
        build_component(root / "handler.py", output=tmp_path / "o.wasm", world="app")
    err = caught.value
    assert err.export == name
    assert err.filename == str(root / "wit" / "app.wit")
    assert err.lineno == 9
    assert f"named {name!r}" in err.message
    assert "C function" in err.message
    assert "panicked" not in err.message


@given(
    st.sampled_from(sorted(LINKED_SYMBOLS))
    | st.from_regex(r"[a-z][a-z0-9]{0,8}(-[a-z][a-z0-9]{0,5}){0,2}", fullmatch=True)
)
def test_only_linked_symbols_clash(name: str) -> None:
    """Any WIT name is refused exactly when it is one of the linked C symbols."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        wit = Path(tmp) / "app.wit"
        wit.write_text(f"package demo:x;\nworld w {{\n  export %{name}: func();\n}}\n")
        if name in LINKED_SYMBOLS:
            with pytest.raises(ExportNameClash) as caught:
                check_export_names(wit, "w")
            assert caught.value.export == name
        else:
            check_export_names(wit, "w")


def test_interface_functions_and_rand_do_not_clash(tmp_path: Path) -> None:
    """read/write inside interfaces, and rand (libc.so's, not the main module's), are fine."""
    root = _project(tmp_path, "rand")
    check_export_names(root / "wit", "app")


def test_syntax_error_is_reported_before_componentize_py(
    tmp_path: Path, no_componentize: None
) -> None:
    """A handler that does not parse is a HandlerSyntaxError with its file and line, at once."""
    shutil.copytree(BROKEN, tmp_path / "broken")
    source = tmp_path / "broken" / "syntax_error.py"
    with pytest.raises(HandlerSyntaxError) as caught:
        build_component(source, output=tmp_path / "out.wasm")
    assert caught.value.filename == str(source)
    assert caught.value.lineno == 8
    assert "SyntaxError: unterminated string literal" in caught.value.message


def test_syntax_error_in_an_imported_module_is_found(tmp_path: Path, no_componentize: None) -> None:
    """A syntax error in a local module the handler imports is reported with that module."""
    shutil.copytree(BROKEN, tmp_path / "broken")
    (tmp_path / "broken" / "helper.py").write_text("def f(:\n    pass\n")
    source = tmp_path / "broken" / "uses_helper.py"
    source.write_text("import helper\n")
    with pytest.raises(HandlerSyntaxError) as caught:
        build_component(source, output=tmp_path / "out.wasm")
    assert caught.value.filename == str(tmp_path / "broken" / "helper.py")
    assert caught.value.lineno == 1


def test_newer_guest_syntax_is_left_to_the_guest(tmp_path: Path) -> None:
    """On a host older than the guest, syntax only the guest may know is not refused."""
    source = tmp_path / "m.py"
    source.write_text("x = 1\ntype Alias = int\n")
    check_syntax([source], host=(3, 11))
    plain = tmp_path / "p.py"
    plain.write_text("x = (1\n")
    with pytest.raises(HandlerSyntaxError):
        check_syntax([plain], host=(3, 11))
