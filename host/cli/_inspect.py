"""`mty inspect-component X.wasm` (alias `mty wit`) and `mty compile X.wasm`.

inspect-component lists what a component exports (the functions `mty call` takes, by the same
names) and imports, with WIT signatures rendered by mighty.abi. Toolchain internals
(componentize-py's ``exports#init``) are left out, as they are from ``Instance.exports``;
``--json`` names them under ``internal``. The text shows each export in full and each imported
interface on one line with what it holds (a componentize-py handler imports about 30 WASI
interfaces: listing their 200 functions made 45 KB for a 5-function handler); ``--imports``
lists them in full, ``--exports`` prints the exports alone. wasmtime's component types are
structural (``record { words: u32, ... }``); the WIT names of the types (``stats``) are read from
the component binary (:mod:`mighty.cli._wit_names`), and the named records, variants, enums and
flags the exports use are listed under ``types``. A component whose encoding that reader does
not know keeps the structural rendering.

compile loads the component into the compiled cache ahead of time, so the first `mty call` or
`mty run` does not pay for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mighty.cli._main import _errors
from mighty.cli._progress import Waits

if TYPE_CHECKING:
    from wasmtime import component as wc

    from mighty.engine import Component

__all__ = ["compile_command", "describe_component", "inspect_command"]


def _function(name: str, fty: wc.FuncType) -> dict[str, Any]:
    from mighty.abi import FuncSig

    try:
        sig = FuncSig.from_func_type(fty)
    except Exception as exc:  # noqa: BLE001 - a type abi cannot render yet must not hide the rest
        return {"name": name, "params": None, "result": None, "wit": f"{name}: ? ({exc})"}
    params = [{"name": p, "type": str(ty)} for p, ty in sig.params]
    result = None if sig.result is None else str(sig.result)
    text = ", ".join(f"{p['name']}: {p['type']}" for p in params)
    wit = f"{name}: func({text})" + ("" if result is None else f" -> {result}")
    return {"name": name, "params": params, "result": result, "wit": wit}


def describe_component(component: Component, data: bytes | None = None) -> dict[str, Any]:
    """Exports and imports of ``component`` with their WIT signatures, as JSON-ready data;
    with its bytes (``data``), the exports' types by their WIT names and those types' WIT."""
    from wasmtime import component as wc

    from mighty.engine import get_engine

    shown = component.export_functions()
    internal = sorted(set(component.export_functions(include_internal=True)) - set(shown))
    imports: list[dict[str, Any]] = []
    for name, extern in component.wasm.type.imports(get_engine()).items():
        if name not in component.imports:
            continue  # a core module it shares with other components (Component.modules)
        item = extern.ty
        if isinstance(item, wc.FuncType):
            imports.append({"name": name, "function": _function(name, item)})
            continue
        functions: list[dict[str, Any]] = []
        resources: list[str] = []
        if isinstance(item, wc.ComponentInstanceType):
            for inner, inner_extern in item.exports(get_engine()).items():
                if isinstance(inner_extern.ty, wc.FuncType):
                    functions.append(_function(inner, inner_extern.ty))
                elif isinstance(inner_extern.ty, wc.ResourceType):
                    resources.append(inner)
        imports.append({"name": name, "resources": resources, "functions": functions})
    exports = [_function(name, fty) for name, fty in shown.items()]
    types: list[str] = []
    if data is not None:
        from mighty.cli._wit_names import named_signatures

        named = named_signatures(data)
        if named is not None:
            for export in exports:
                export["wit"] = named.functions.get(export["name"], export["wit"])
            types = named.types
    return {
        "component": component.origin,
        "sha256": component.sha256,
        "bytes": component.size,
        "exports": exports,
        "types": types,
        "internal": internal,
        "imports": imports,
    }


@click.command("inspect-component")
@click.argument("component", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("--exports", "only_exports", is_flag=True, help="Only the exported functions.")
@click.option("--imports", "all_imports", is_flag=True, help="Every imported function, in full.")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def inspect_command(
    component: Path, as_json: bool, only_exports: bool, all_imports: bool, quiet: bool
) -> None:
    """List the exports of COMPONENT with their WIT signatures, and what it imports."""
    from mighty.engine import Component

    with _errors(as_json):
        with Waits(not quiet) as show:
            loaded = Component.load(component, progress=show)
        described = describe_component(loaded, _bytes(component))
        if only_exports:
            described = {k: v for k, v in described.items() if k not in ("imports", "internal")}
        if as_json:
            click.echo(json.dumps({"ok": True, **described}))
            return
        click.echo(f"{component} (sha256 {loaded.sha256[:12]}, {loaded.size / 1e6:.1f} MB)")
        click.echo(f"exports (call with `mty call {component} NAME ARGS...`):")
        for item in described["exports"]:
            click.echo(f"  {item['wit']}")
        if not described["exports"]:
            click.echo("  (no functions)")
        if described["types"]:
            click.echo("types:")
            for text in described["types"]:
                click.echo(f"  {text}")
        if only_exports:
            return
        if not described["imports"]:
            click.echo("imports: (none)")
            return
        click.echo("imports:" if all_imports else "imports (--imports lists their functions):")
        for entry in described["imports"]:
            if "function" in entry:
                click.echo(f"  {entry['function']['wit']}")
                continue
            if not all_imports:
                held = [_count(len(entry["functions"]), "function")]
                if entry["resources"]:
                    held.append(_count(len(entry["resources"]), "resource"))
                click.echo(f"  {entry['name']} ({', '.join(held)})")
                continue
            click.echo(f"  {entry['name']}")
            for resource in entry["resources"]:
                click.echo(f"    resource {resource}")
            for item in entry["functions"]:
                click.echo(f"    {item['wit']}")


def _bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


@click.command("compile")
@click.argument("components", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def compile_command(components: tuple[Path, ...], as_json: bool, quiet: bool) -> None:
    """Compile COMPONENTS ahead of time into the compiled cache (what the first call would do)."""
    import time

    from mighty.engine import Component

    with _errors(as_json):
        done: list[dict[str, Any]] = []
        for path in components:
            started = time.monotonic()
            with Waits(not quiet) as show:
                loaded = Component.load(path, progress=show)
            seconds = time.monotonic() - started
            done.append(
                {
                    "component": str(path),
                    "sha256": loaded.sha256,
                    "cached": loaded.from_cache,
                    "seconds": round(seconds, 3),
                }
            )
            if not as_json and not quiet:
                note = "already compiled" if loaded.from_cache else f"compiled in {seconds:.1f} s"
                click.echo(f"{path}: {note} (sha256 {loaded.sha256[:12]})")
        if as_json:
            click.echo(json.dumps({"ok": True, "components": done}))
