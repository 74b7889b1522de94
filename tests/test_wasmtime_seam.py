"""wasmtime-py's private parts are reached through one seam, and what mighty uses of them exists.

Walks every module of `mighty` with `ast` (as tests/test_layers.py does): only
`mighty._wasmtime` may import a private module of wasmtime-py or call a private `_from_ptr`;
every attribute another module reads of a name it imported from the seam must exist in the
installed wasmtime-py, so an upgrade that renames a C binding fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mighty._wasmtime as seam
from tests.test_layers import _modules, _tree

SEAM = "mighty._wasmtime"


def _private_wasmtime(module: str) -> bool:
    return module.startswith("wasmtime") and any(p.startswith("_") for p in module.split("."))


def test_only_the_seam_reaches_private_parts_of_wasmtime() -> None:
    """No module but the seam imports wasmtime-py's private modules or calls `_from_ptr`."""
    found = []
    for name, path in _modules().items():
        if name == SEAM:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
                if _private_wasmtime(node.module) or any(map(_private_wasmtime, names)):
                    found.append(f"{name}:{node.lineno} imports from {node.module}")
            elif isinstance(node, ast.Import):
                found += [
                    f"{name}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if _private_wasmtime(a.name)
                ]
            elif isinstance(node, ast.Attribute) and node.attr == "_from_ptr":
                found.append(f"{name}:{node.lineno} calls {node.attr}")
    assert found == []


def _seam_attributes(path: Path) -> list[tuple[str, str, int]]:
    """(seam name, attribute, line) for each `X.attr` where X was imported from the seam."""
    tree = _tree(path)
    local: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == SEAM:
            local.update({a.asname or a.name: a.name for a in node.names})
    used = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in local
        ):
            used.append((local[node.value.id], node.attr, node.lineno))
    return used


def test_every_private_name_mighty_uses_exists() -> None:
    """Each attribute read of the seam's modules (`ffi.x`, ...) is in this wasmtime-py."""
    checked = 0
    missing = []
    for name, path in _modules().items():
        for exported, attribute, line in _seam_attributes(path):
            target = getattr(seam, exported)
            checked += 1
            if not hasattr(target, attribute):
                missing.append(f"{name}:{line} {exported}.{attribute}")
    assert missing == []
    assert checked > 100  # the walk found the uses (there are hundreds)
    assert set(seam.__all__) <= set(dir(seam))
