"""The build hook of the optional C extensions (hatch_build.py at the checkout's root).

What each extension computes is held to its pure-Python path by the tests of its package; here:
which sources become which modules, that the interpreter's compiler settings build an importable
module, that a compiler error fails loudly, and that the checkout under test runs its extensions
as built from their current sources (also when the suite runs with MIGHTY_PURE_PYTHON=1: the
packages' tests of their compiled paths choose them explicitly).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
try:
    import hatch_build
finally:
    sys.path.remove(str(ROOT))

MODULE = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyLong_FromLong(42);
}
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_probe", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__probe(void) { return PyModule_Create(&module); }
"""


def test_sources_are_named_by_their_path_and_a_symlinked_folder_is_not_walked(
    tmp_path: Path,
) -> None:
    (tmp_path / "host" / "trace").mkdir(parents=True)
    (tmp_path / "host" / "trace" / "_speedups.c").write_text("")
    (tmp_path / "host" / "trace" / "_speedups.pyi").write_text("")
    (tmp_path / "host" / "_top.c").write_text("")
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "_wake.c").write_text("")
    (tmp_path / "host" / "sandbox").symlink_to("../sandbox")  # as in the checkout

    found = hatch_build.extensions(tmp_path)

    assert [(source.relative_to(tmp_path).as_posix(), target) for source, target in found] == [
        ("host/_top.c", "mighty/_top"),
        ("host/trace/_speedups.c", "mighty/trace/_speedups"),
        ("sandbox/_wake.c", "mighty/sandbox/_wake"),
    ]


def test_a_source_compiles_into_an_importable_module_and_is_rebuilt_only_when_newer(
    tmp_path: Path,
) -> None:
    (tmp_path / "host").mkdir()
    (tmp_path / "sandbox").mkdir()
    source = tmp_path / "host" / "_probe.c"
    source.write_text(MODULE)

    built = hatch_build.build_in_place(tmp_path)

    output = source.with_name("_probe" + hatch_build.suffix())
    assert built == [output]
    spec = importlib.util.spec_from_file_location("_probe", output)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.answer() == 42
    assert hatch_build.build_in_place(tmp_path) == []  # current: not built again
    os.utime(source, (output.stat().st_mtime + 10, output.stat().st_mtime + 10))
    assert hatch_build.build_in_place(tmp_path) == [output]


def test_modules_of_one_name_in_two_folders_are_two_files_in_the_wheel(tmp_path: Path) -> None:
    """mighty/abi/_speedups and mighty/trace/_speedups: each target gets its own compiled
    file (one temporary file for both once put the trace's module under both names)."""
    (tmp_path / "sandbox").mkdir()
    for folder, answer in (("abi", 1), ("trace", 2)):
        (tmp_path / "host" / folder).mkdir(parents=True)
        source = MODULE.replace("_probe", "_speedups").replace("42", str(answer))
        (tmp_path / "host" / folder / "_speedups.c").write_text(source)

    included = hatch_build.build_for_wheel(tmp_path)

    assert sorted(included.values()) == [
        f"mighty/abi/_speedups{hatch_build.suffix()}",
        f"mighty/trace/_speedups{hatch_build.suffix()}",
    ]
    answers = {}
    for built, target in included.items():
        spec = importlib.util.spec_from_file_location("_speedups", built)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        answers[target.split("/")[1]] = module.answer()
    assert answers == {"abi": 1, "trace": 2}


def test_a_compiler_error_fails_with_the_compilers_output(tmp_path: Path) -> None:
    source = tmp_path / "_broken.c"
    source.write_text("int broken( {\n")

    with pytest.raises(RuntimeError, match=r"compiling _broken\.c failed(.|\n)*_broken\.c:1"):
        hatch_build.compile_one(source, tmp_path / "_broken.so")
    assert not (tmp_path / "_broken.so").exists()


def test_the_checkout_runs_every_extension_built_from_its_current_source() -> None:
    found = hatch_build.extensions(ROOT)
    assert found, "no C extension found under host/ or sandbox/"
    for source, target in found:
        module = importlib.import_module(target.replace("/", "."))
        assert module.__file__ is not None
        built = Path(module.__file__)
        assert built.suffix != ".py", f"{target} is not a compiled module: {built}"
        assert built.stat().st_mtime >= source.stat().st_mtime, (
            f"{built.name} is older than {source.name}: run `.venv/bin/python hatch_build.py`"
        )


def test_no_compiler_at_all_fails_with_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "_probe.c"
    source.write_text(MODULE)
    real = hatch_build.sysconfig.get_config_var

    def config(name: str) -> object:
        return str(tmp_path / "no-such-cc") if name == "LDSHARED" else real(name)

    monkeypatch.setattr(hatch_build.sysconfig, "get_config_var", config)

    with pytest.raises(RuntimeError, match="MIGHTY_PURE_PYTHON=1"):
        hatch_build.compile_one(source, tmp_path / "_probe.so")
