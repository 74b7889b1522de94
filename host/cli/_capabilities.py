"""``mty capabilities MANIFEST``: what a manifest declares and which agent types hold what.

Read from the manifest alone: nothing is built, no MCP server is started and no host tool is
imported, so it answers in a moment even for a manifest whose servers are down.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from mighty.cli._main import _errors

__all__ = ["capabilities_command"]


def _declared(manifest: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, cap in sorted(manifest.capabilities.items()):
        if cap.tool is not None:
            out.append({"name": name, "kind": "tool", "target": cap.tool})
        elif cap.mcp is not None:
            item: dict[str, Any] = {"name": name, "kind": "mcp"}
            if cap.mcp.command:
                item["command"] = list(cap.mcp.command)
            else:
                item["url"] = cap.mcp.url
            if cap.mcp.tools is not None:
                item["tools"] = sorted(cap.mcp.tools)
            out.append(item)
        else:
            origins = [g if isinstance(g, str) else g.origin for g in cap.http or []]
            out.append({"name": name, "kind": "http", "origins": origins})
    return out


def _grants(manifest: Any) -> dict[str, dict[str, list[str]]]:
    return {
        name: {
            "capabilities": sorted(spec.capabilities),
            "http": [g if isinstance(g, str) else g.origin for g in spec.http],
            "spawns": sorted(spec.spawns),
            "messages": sorted(spec.messages),
            "inspects": sorted(spec.inspects),
        }
        for name, spec in sorted(manifest.agents.items())
    }


@click.command("capabilities")
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def capabilities_command(manifest: Path, as_json: bool) -> None:
    """List the capabilities MANIFEST declares and what each agent type is granted."""
    from mighty.agents import load_manifest

    with _errors(as_json):
        spec, _base = load_manifest(manifest)
        declared, grants = _declared(spec), _grants(spec)
        if as_json:
            click.echo(json.dumps({"capabilities": declared, "agents": grants}))
            return
        click.echo("capabilities:" if declared else "capabilities: none declared")
        for item in declared:
            where = item.get("target") or " ".join(item.get("command", [])) or item.get("url")
            if item["kind"] == "http":
                where = ", ".join(item["origins"])
            only = f" (only {', '.join(item['tools'])})" if "tools" in item else ""
            click.echo(f"  {item['name']}: {item['kind']} {where}{only}")
        click.echo("agent types:")
        for name, held in grants.items():
            parts = [
                f"{what} {', '.join(values) or 'none'}"
                for what, values in held.items()
                if values or what in ("capabilities", "spawns")
            ]
            click.echo(f"  {name}: " + "; ".join(parts))
