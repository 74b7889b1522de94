"""The layering holds: no import cycle between packages, no private module or attribute of
another package.

Walks every module of `mighty` (host/ and sandbox/) with `ast`, so the rule holds from now on.
There is no list of known debts: the last ones went in issue 12, and any new one fails here.
An import inside a function or under `TYPE_CHECKING` counts like any other: a cycle hidden in a
function is still a cycle. (Late imports remain where they load an optional extra, such as
OpenTelemetry, or a heavy layer only some commands need; they point down, so close no cycle.)
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules(root: Path = ROOT) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for base, prefix in ((root / "host", ["mighty"]), (root / "sandbox", ["mighty", "sandbox"])):
        for path in base.rglob("*.py"):
            relative = path.relative_to(base).with_suffix("").parts
            if base.name == "host" and relative and relative[0] == "sandbox":
                continue  # the symlink to sandbox/, walked as itself
            parts = [*prefix, *relative]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports() -> list[tuple[str, str, bool]]:
    """(importing module, imported module, at module level) for every import of `mighty`."""
    modules = _modules()
    out = []
    for name, path in modules.items():
        tree = _tree(path)
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


def test_no_import_cycle_at_all() -> None:
    """Not even through imports in functions or under TYPE_CHECKING do two packages meet."""
    assert _cycles(_package_edges(top_only=False)) == set()


def test_no_private_module_of_another_package() -> None:
    """Nothing imports another package's private `_module`."""
    assert _private_crossings() == set()


# -- private attributes ---------------------------------------------------------------------
#
# A heuristic, since Python has no types at this level: a private name (`_x`, not a dunder)
# belongs to the packages whose modules define it: a module-level name, a name in a class
# body, an attribute assigned anywhere (`obj._x = ...`) or a `__slots__` entry. In package P:
# - `self._x` and `cls._x` are the object's own (or its base's): never flagged;
# - `expr._x` is flagged when `_x` is defined only in other packages' modules;
# - `name._x` is flagged too when `name` is annotated (a parameter or `name: T = ...`) with a
#   class another package defines and that class defines `_x` (this catches names that are
#   common to several packages, such as `_run`, when the type is written down);
# - `from mighty.x import _y` of a private name (not a module) of another package is flagged.
# Private names of third-party libraries (wasmtime-py's `_context`, `_ffi`) are not looked at:
# no module of mighty defines them. Missed: an unannotated `obj._x` whose `_x` P defines too.
# Third-party protocols that mighty implements or reads, named here so they are not taken for
# mighty's own: wasmtime-py's Storelike `_context()` (the gate's CallStore implements it, so
# wasmtime-py accepts it where a store goes) and ctypes' documented `CDLL._name`.
THIRD_PARTY = {"_context"}
THIRD_PARTY_ACCESS = {"ffi.dll._name"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _body_names(body: list[ast.stmt]) -> set[str]:
    found: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                found.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.If | ast.Try):
            found |= _body_names(node.body) | _body_names(node.orelse)
    return found


def _definitions(
    modules: dict[str, Path],
) -> tuple[dict[str, set[str]], dict[str, tuple[str, set[str]]]]:
    """(private name -> packages defining it, class name -> (its package, its private names))."""
    names: dict[str, set[str]] = defaultdict(set)
    classes: dict[str, tuple[str, set[str]]] = {}
    for module, path in modules.items():
        package = _package(module)
        tree = _tree(path)
        found = _body_names(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                members = _body_names(node.body)
                for item in ast.walk(node):
                    if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        members.add(item.attr)
                found |= members
                classes[node.name] = (package, {m for m in members if _private(m)})
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                found.add(node.attr)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
            ):
                found |= {
                    c.value
                    for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
        for name in found:
            if _private(name):
                names[name].add(package)
    return names, classes


def _annotated(tree: ast.AST) -> dict[int, dict[str, str]]:
    """For each function (by id), its annotated names -> the class name of the annotation."""
    out: dict[int, dict[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            hints: dict[str, str] = {}
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if isinstance(arg.annotation, ast.Name):
                    hints[arg.arg] = arg.annotation.id
            for item in ast.walk(node):
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and isinstance(item.annotation, ast.Name)
                ):
                    hints[item.target.id] = item.annotation.id
            for item in ast.walk(node):
                out.setdefault(id(item), hints)
    return out


def _private_attribute_crossings(root: Path = ROOT) -> set[tuple[str, str]]:
    """(module, `expr._name` as written) for every private name reached across packages."""
    modules = _modules(root)
    names, classes = _definitions(modules)
    found: set[tuple[str, str]] = set()
    for module, path in modules.items():
        package = _package(module)
        tree = _tree(path)
        hints = _annotated(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module in modules:
                if _package(node.module) != package:
                    found.update(
                        (module, f"{node.module}.{a.name}")
                        for a in node.names
                        if _private(a.name) and f"{node.module}.{a.name}" not in modules
                    )
                continue
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            if node.attr in THIRD_PARTY or ast.unparse(node) in THIRD_PARTY_ACCESS:
                continue
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            owners = names.get(node.attr, set())
            flagged = bool(owners) and package not in owners
            if not flagged and isinstance(receiver, ast.Name):
                hinted = hints.get(id(node), {}).get(receiver.id)
                if hinted in classes:
                    owner, members = classes[hinted]
                    flagged = owner != package and node.attr in members
            if flagged:
                found.add((module, ast.unparse(node)))
    return found


def test_private_attribute_check_flags_crossings(tmp_path: Path) -> None:
    """On two small packages, the check flags each kind of crossing and nothing of one's own."""
    (tmp_path / "sandbox").mkdir()
    for package, text in {
        "a": """
class Thing:
    _shared = 1

    def __init__(self):
        self._secret = 0
        self._run = None

    def own(self, other: "Thing"):
        return self._secret + other._secret


def _helper():
    return 0
""",
        "b": """
from mighty.a._m import Thing, _helper


class Local:
    def __init__(self):
        self._run = None


def reach(thing, typed: Thing):
    self = thing
    return thing._secret, typed._run, self._secret, thing.__dict__, thing._unknown
""",
    }.items():
        (tmp_path / "host" / package).mkdir(parents=True)
        (tmp_path / "host" / package / "__init__.py").write_text("")
        (tmp_path / "host" / package / "_m.py").write_text(text)
    assert _private_attribute_crossings(tmp_path) == {
        ("mighty.b._m", "mighty.a._m._helper"),  # a private name imported
        ("mighty.b._m", "thing._secret"),  # defined only in package a
        ("mighty.b._m", "typed._run"),  # b defines _run too, but typed is annotated Thing
    }


def test_no_private_attribute_of_another_package() -> None:
    """No module reaches a private attribute or name that only another package defines."""
    assert _private_attribute_crossings() == set()


# -- inside the agents package --------------------------------------------------------------

AGENTS_ORDER = [
    # leaves: data and mechanisms that know no agent
    "_types",
    "_mailbox",
    "_reply",
    "_output",
    "_introspect",
    "_scheduler",
    "_store",
    "_journal",
    "_timers",
    "_swap",
    # the host interface, hibernation, then the process and the runtime
    "_host",
    "_seats",
    "_hibernate",
    "_process",
    "_runtime",
    # what is built on a runtime
    "_supervisor",
    "_tree",
    "_manifest",
    "_compose",
    "_history",
    "_application",
]
"""The layers inside mighty.agents, lowest first: a module imports (when it loads) only
modules before it. A new module takes its place here; a move up or down is a decision."""


def test_the_agents_package_keeps_its_layer_order() -> None:
    """Each module of mighty.agents imports, at load, only modules below it in AGENTS_ORDER."""
    found = {name for name in _modules() if name.startswith("mighty.agents._")}
    assert {name.rsplit(".", 1)[1] for name in found} == set(AGENTS_ORDER)
    rank = {name: i for i, name in enumerate(AGENTS_ORDER)}
    wrong = []
    for importer, imported, top in _imports():
        if not (top and importer.startswith("mighty.agents._")):
            continue
        if not imported.startswith("mighty.agents._"):
            continue
        here = importer.rsplit(".", 1)[1]
        there = imported.split(".")[2]
        if rank[there] >= rank[here]:
            wrong.append(f"{here} imports {there}")
    assert wrong == []
