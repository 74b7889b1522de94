"""The layering holds: no import cycle between packages, no private module of another package.

Walks every module of `mighty` (host/ and sandbox/) with `ast`, so the rule holds from now on.
The known debts below are the ones left to remove (issue 12); each entry must still occur, so
the lists only ever shrink.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (importing module, imported private module) pairs still to remove.
KNOWN_PRIVATE = {
    ("mighty.cli._mcp", "mighty.sandbox._mcp"),
    ("mighty.cli._run", "mighty.agents._manifest"),
    ("mighty.trace._replay", "mighty.gate._gate"),
}
# Function-level (lazy) imports that point up the layers and so close a cycle: the root's
# errors reaching into budget, agents and reload using each other, replay making instances.
KNOWN_LAZY_UPWARD = {
    ("_errors", "budget"),
    ("agents", "reload"),
    ("reload", "agents"),
    ("trace", "instance"),
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for base, prefix in ((ROOT / "host", ["mighty"]), (ROOT / "sandbox", ["mighty", "sandbox"])):
        for path in base.rglob("*.py"):
            relative = path.relative_to(base).with_suffix("").parts
            if base.name == "host" and relative and relative[0] == "sandbox":
                continue  # the symlink to sandbox/, walked as itself
            parts = [*prefix, *relative]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports() -> list[tuple[str, str, bool]]:
    """(importing module, imported module, at module level) for every import of `mighty`."""
    modules = _modules()
    out = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            targets: list[str] = []
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("mighty")
            ):
                targets.append(node.module)
                # `from mighty.x import _y` names a module when _y is one.
                targets += [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets += [a.name for a in node.names if a.name.startswith("mighty")]
            out += [(name, t, id(node) in top) for t in targets if t in modules]
    return out


def _private_crossings() -> set[tuple[str, str]]:
    found = set()
    for source, target, _top in _imports():
        source_pkg, target_pkg = _package(source), _package(target)
        if not target_pkg or target_pkg == source_pkg or target_pkg.startswith("_"):
            continue  # mighty._errors and friends are the shared root, meant for every layer
        private = [p for p in target.split(".")[2:] if p.startswith("_") and p != "__init__"]
        if private:
            found.add((source, target))
    return found


def _package_edges(*, top_only: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for source, target, top in _imports():
        if top_only and not top:
            continue
        a, b = _package(source), _package(target)
        if a and b and a != b:
            edges[a].add(b)
    return edges


def _cycles(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Package pairs on a cycle (any length), as sorted pairs of neighbours on it."""
    found: set[tuple[str, str]] = set()
    for start in edges:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start:
                    found.update(
                        (min(a, b), max(a, b))
                        for a, b in zip(path, [*path[1:], start], strict=True)
                    )
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return found


def test_the_walk_sees_the_whole_package() -> None:
    """The walk finds the layers (a broken walk must not pass every rule by seeing nothing)."""
    packages = {_package(m) for m in _modules()}
    assert {"engine", "gate", "wasi", "budget", "trace", "agents", "sandbox", "cli"} <= packages
    assert len(_imports()) > 100


def test_no_import_cycle_at_module_level() -> None:
    """No two packages import each other when their modules load."""
    assert _cycles(_package_edges(top_only=True)) == set()


def test_lazy_cycles_only_shrink() -> None:
    """Without the known upward lazy imports there is no cycle at all; each still exists."""
    edges = _package_edges(top_only=False)
    for source, target in KNOWN_LAZY_UPWARD:
        assert target in edges[source], f"{source} -> {target} is gone: drop it from the list"
        edges[source].discard(target)
    assert _cycles(edges) == set()


def test_no_private_module_of_another_package() -> None:
    """Nothing imports another package's private `_module` beyond the known debts."""
    assert _private_crossings() == KNOWN_PRIVATE
