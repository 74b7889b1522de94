"""`mty cache`: what the cache directory holds, and pruning it.

    mty cache [list] [--json]           # sections, entries, sizes, the total on disk
    mty cache prune [--max-size SIZE] [--older-than DAYS] [--components] [--dry-run] [--json]

The cache (``$MTY_CACHE_DIR``, else the platform's user cache directory) has four sections:
``builds`` (componentize-py outputs by build key), ``compiled`` (native code by component and
wasmtime version, and the core modules components share, ``module-<sha256>``: removing one only
means it is compiled again), ``components`` (every component loaded, by sha256, so ``mty
replay`` finds what a trace names) and ``sandbox`` (the code-mode interpreter builds). Nothing
evicted entries before: ten builds of agents made 673 MB.

``prune`` always removes what no one can use: compiled code of other wasmtime versions or
engine settings, temporary files and staging folders a killed build left (older than an hour),
and build lock files no one holds. ``--max-size`` then removes the least recently used entries
(by the later of their access and change times) until the total fits; ``--older-than`` removes
entries not used for that many days. ``components`` entries are kept unless ``--components``:
a trace can only be replayed while its component is somewhere, and this may be the only copy.
Everything removed is rebuilt or recompiled on its next use. Files are hard links when a build
and the component store hold the same bytes (``mighty.build``): sizes count each file once.

Rejected: eviction on every build (a build must not pay for a directory walk, and a limit
belongs to the user, not a default); deleting by mtime alone (a build used every day was
written once).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from mighty._errors import BadInput
from mighty.cli._main import _errors, parse_size

__all__ = ["CacheEntry", "cache_command", "cache_entries", "prune_cache"]

SECTIONS = ("builds", "compiled", "components", "sandbox")
_STALE_AFTER = 3600.0
_SHA = re.compile(r"^([0-9a-f]{64})")


@dataclass
class CacheEntry:
    """One thing in the cache that is used (and removed) whole: its files and their sizes."""

    section: str
    name: str
    files: list[Path] = field(default_factory=list)
    size: int = 0
    """Bytes on disk, a hard-linked file counted in the first entry that holds it."""
    used: float = 0.0
    """The latest access or change time of its files (seconds since the epoch)."""
    usable: bool = True
    """False for what no one can use any more (other wasmtime versions, leftovers)."""
    inodes: dict[tuple[int, int], int] = field(default_factory=dict)
    """Each of its files' ``(device, inode)`` and bytes on disk: removing an entry frees a
    hard-linked file's bytes only with the last entry that holds it."""


def _current_compiled(root: Path) -> Path:
    from mighty.engine import CompiledCache

    return CompiledCache(root).directory


def cache_entries(root: Path, *, now: float | None = None) -> list[CacheEntry]:
    """Every entry under ``root``, hard links counted once (in the first entry listed);
    leftovers count as such once an hour older than ``now`` (default: the clock)."""
    seen: set[tuple[int, int]] = set()
    entries: list[CacheEntry] = []
    current = _current_compiled(root)
    now = time.time() if now is None else now

    def add(entry: CacheEntry, path: Path) -> None:
        try:
            info = path.stat()
        except OSError:
            return
        entry.files.append(path)
        entry.used = max(entry.used, info.st_atime, info.st_mtime)
        key = (info.st_dev, info.st_ino)
        size = info.st_blocks * 512 if info.st_blocks else info.st_size
        entry.inodes[key] = size
        if key not in seen:
            seen.add(key)
            entry.size += size

    for section in SECTIONS:
        base = root / section
        if not base.is_dir():
            continue
        grouped: dict[str, CacheEntry] = {}
        for dirpath, dirnames, filenames in os.walk(base):
            directory = Path(dirpath)
            for name in sorted(dirnames):
                if name.endswith(".stage"):  # a build's staging folder
                    stage = CacheEntry(section, f"{directory.name}/{name}", usable=False)
                    for sub, _, files in os.walk(directory / name):
                        for file in files:
                            add(stage, Path(sub, file))
                    stage.files = [directory / name]
                    if now - _mtime(directory / name) > _STALE_AFTER:
                        entries.append(stage)
            dirnames[:] = [d for d in dirnames if not d.endswith(".stage")]
            for name in sorted(filenames):
                path = directory / name
                leftover = name.startswith(".") and name.endswith((".tmp", ".wasm"))
                if name.startswith(".") and name.endswith(".lock"):
                    if _unheld(path):
                        entries.append(CacheEntry(section, name, [path], 0, 0.0, usable=False))
                    continue
                if leftover:
                    if now - _mtime(path) > _STALE_AFTER:
                        stale = CacheEntry(section, name, usable=False)
                        add(stale, path)
                        entries.append(stale)
                    continue
                match = _SHA.match(name)
                key = f"{directory.relative_to(base)}/{match[1] if match else name}"
                entry = grouped.get(key)
                if entry is None:
                    usable = section != "compiled" or directory == current
                    entry = grouped[key] = CacheEntry(section, key.lstrip("./"), usable=usable)
                add(entry, path)
        entries.extend(grouped.values())
    return entries


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _unheld(lock: Path) -> bool:
    """True when no builder holds ``lock`` (checked with a non-blocking flock)."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _remove(entry: CacheEntry) -> None:
    for path in entry.files:
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def prune_cache(
    root: Path,
    *,
    max_size: int | None = None,
    older_than: float | None = None,
    components: bool = False,
    dry_run: bool = False,
    now: float | None = None,
) -> list[CacheEntry]:
    """Remove (unless ``dry_run``) what :func:`cache_entries` marks unusable, then entries
    unused for ``older_than`` seconds, then the least recently used until the total is at most
    ``max_size`` bytes; ``components`` entries only when ``components``. Returns the removed."""
    now = time.time() if now is None else now
    entries = cache_entries(root, now=now)
    removed = [e for e in entries if not e.usable]
    kept = [e for e in entries if e.usable]
    candidates = sorted(
        (e for e in kept if components or e.section != "components"), key=lambda e: e.used
    )
    if older_than is not None:
        old = [e for e in candidates if now - e.used > older_than]
        removed += old
        candidates = [e for e in candidates if e not in old]
    if max_size is not None:
        holders: dict[tuple[int, int], int] = {}
        sizes: dict[tuple[int, int], int] = {}
        for entry in kept:
            if entry in removed:
                continue
            for key, size in entry.inodes.items():
                holders[key] = holders.get(key, 0) + 1
                sizes[key] = size
        total = sum(sizes.values())
        for entry in candidates:
            if total <= max_size:
                break
            removed.append(entry)
            for key in entry.inodes:
                holders[key] -= 1
                if holders[key] == 0:
                    total -= sizes[key]
    if not dry_run:
        for entry in removed:
            _remove(entry)
    return removed


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


_ABOUT = {
    "builds": "componentize-py outputs, by build key",
    "compiled": "native code, by component (and shared module) and wasmtime version",
    "components": "components traces name, for mty replay",
    "sandbox": "code-mode interpreter builds",
}


@click.group("cache", invoke_without_command=True)
@click.pass_context
def cache_command(ctx: click.Context) -> None:
    """Show the cache directory's sections and sizes (`mty cache list`), or prune it."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_command)


@cache_command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def list_command(as_json: bool) -> None:
    """Each section of the cache: entries and bytes on disk (hard links counted once)."""
    from mighty._cachedir import cache_root

    with _errors(as_json):
        root = cache_root()
        entries = cache_entries(root)
        sections: dict[str, dict[str, Any]] = {}
        for section in SECTIONS:
            mine = [e for e in entries if e.section == section and e.usable]
            sections[section] = {"entries": len(mine), "bytes": sum(e.size for e in mine)}
        leftover = [e for e in entries if not e.usable]
        sections["unusable"] = {
            "entries": len(leftover),
            "bytes": sum(e.size for e in leftover),
        }
        total = sum(e.size for e in entries)
        if as_json:
            click.echo(
                json.dumps({"ok": True, "root": str(root), "sections": sections, "bytes": total})
            )
            return
        click.echo(f"{root}")
        for section, about in (*_ABOUT.items(), ("unusable", "removed by mty cache prune")):
            item = sections[section]
            click.echo(
                f"  {section:<11} {item['entries']:>5} entries {_mb(item['bytes']):>12}   {about}"
            )
        click.echo(f"  {'total':<11} {len(entries):>5} entries {_mb(total):>12}")


@cache_command.command("prune")
@click.option(
    "--max-size", "max_size", help="Remove the least recently used until the cache fits (500M)."
)
@click.option("--older-than", "older_than", type=click.FloatRange(0), help="Days unused.")
@click.option("--components", is_flag=True, help="Also prune stored components (traces need them).")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def prune_command(
    max_size: str | None,
    older_than: float | None,
    components: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove what no one can use, and with --max-size/--older-than the least recently used."""
    from mighty._cachedir import cache_root

    with _errors(as_json):
        limit = None
        if max_size is not None:
            limit = parse_size(max_size)
            if limit < 0:
                raise BadInput(f"--max-size must be >= 0, got {max_size}")
        root = cache_root()
        before = sum(e.size for e in cache_entries(root))
        removed = prune_cache(
            root,
            max_size=limit,
            older_than=None if older_than is None else older_than * 86400,
            components=components,
            dry_run=dry_run,
        )
        # Measured after, not summed: a hard-linked file is freed only with its last holder.
        freed = (
            sum(e.size for e in removed)
            if dry_run
            else before - sum(e.size for e in cache_entries(root))
        )
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "ok": True,
                        "dry_run": dry_run,
                        "removed": [
                            {"section": e.section, "name": e.name, "bytes": e.size} for e in removed
                        ],
                        "bytes_before": before,
                        "bytes_freed": freed,
                    }
                )
            )
            return
        verb = "would remove" if dry_run else "removed"
        hint = ""
        if limit is not None and before - freed > limit and not components:
            hint = "; the rest is stored components (traces need them): --components prunes them"
        click.echo(
            f"{verb} {len(removed)} entries, {_mb(freed)} of {_mb(before)} "
            f"({_mb(before - freed)} left{hint})"
        )
