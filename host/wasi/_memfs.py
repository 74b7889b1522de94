"""The in-memory directory tree behind a ``MemoryDir`` preopen.

Files are ``bytearray`` nodes, directories are dicts of nodes; there are no symlinks (a guest
cannot make one and the seed cannot contain one). Every byte stored and every directory entry
is charged to one account with a ceiling (``MemoryDir.max_bytes``): the guest's writes beyond it
fail with ``insufficient-space``. A file's bytes stay charged until no name links it *and* no
descriptor or stream holds it (``holders``), so unlinking an open file frees nothing early.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from mighty._errors import BadInput
from mighty.wasi._paths import FsError, dir_only, split_path

__all__ = ["ENTRY_COST", "MemFs", "MemNode"]

ENTRY_COST = 64
"""Bytes charged per directory entry on top of its name, so empty files are not free."""

_INODES = itertools.count(1)


@dataclass(eq=False)
class MemNode:
    """A file (``children is None``) or a directory."""

    children: dict[str, MemNode] | None
    data: bytearray = field(default_factory=bytearray)
    atime: int = 0
    mtime: int = 0
    ctime: int = 0
    nlink: int = 1
    holders: int = 0
    ino: int = field(default_factory=lambda: next(_INODES))

    @property
    def is_dir(self) -> bool:
        return self.children is not None


class MemFs:
    """One in-memory tree with its byte account."""

    def __init__(
        self, files: Mapping[str, bytes], *, max_bytes: int, clock: Callable[[], int]
    ) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.clock = clock
        now = clock()
        self.root = MemNode({}, atime=now, mtime=now, ctime=now)
        for path, data in files.items():
            self._seed(path, bytes(data))

    def _seed(self, path: str, data: bytes) -> None:
        parts = split_path(path)
        if not parts or ".." in parts:
            raise BadInput(f"MemoryDir file path must be relative and plain, got {path!r}")
        node = self.root
        for part in parts[:-1]:
            assert node.children is not None
            child = node.children.get(part)
            if child is None:
                child = self.add(node, part, directory=True)
            if not child.is_dir:
                raise BadInput(f"MemoryDir path {path!r} goes through a file")
            node = child
        assert node.children is not None
        if parts[-1] in node.children:
            raise BadInput(f"MemoryDir path {path!r} given twice")
        self.resize(self.add(node, parts[-1], directory=False), data, 0)

    # -- the account --------------------------------------------------------------------------

    def charge(self, amount: int) -> None:
        """Take ``amount`` bytes from the account (or refuse with ``insufficient-space``)."""
        if amount > 0 and self.used + amount > self.max_bytes:
            raise FsError("insufficient-space", f"memory directory is limited to {self.max_bytes}")
        self.used += amount

    def resize(self, node: MemNode, data: bytes, offset: int) -> int:
        """Write ``data`` into file ``node`` at ``offset`` (zero-filling a gap); charge growth."""
        end = offset + len(data)
        growth = max(0, end - len(node.data))
        self.charge(growth)
        if offset > len(node.data):
            node.data.extend(bytes(offset - len(node.data)))
        node.data[offset:end] = data
        node.mtime = node.ctime = self.clock()
        return len(data)

    def truncate(self, node: MemNode, size: int) -> None:
        old = len(node.data)
        if size > old:
            self.charge(size - old)
            node.data.extend(bytes(size - old))
        else:
            del node.data[size:]
            self.used -= old - size
        node.mtime = node.ctime = self.clock()

    # -- the tree -----------------------------------------------------------------------------

    def add(self, parent: MemNode, name: str, *, directory: bool) -> MemNode:
        """A new empty file or directory ``name`` in ``parent`` (charged)."""
        assert parent.children is not None
        self.charge(ENTRY_COST + len(name.encode()))
        now = self.clock()
        node = MemNode({} if directory else None, atime=now, mtime=now, ctime=now)
        parent.children[name] = node
        parent.mtime = parent.ctime = now
        return node

    def link(self, parent: MemNode, name: str, node: MemNode) -> None:
        assert parent.children is not None
        self.charge(ENTRY_COST + len(name.encode()))
        parent.children[name] = node
        node.nlink += 1
        parent.mtime = parent.ctime = node.ctime = self.clock()

    def unlink(self, parent: MemNode, name: str) -> MemNode:
        """Remove entry ``name`` from ``parent``; credit it, and the file once unlinked."""
        assert parent.children is not None
        node = parent.children.pop(name)
        self.used -= ENTRY_COST + len(name.encode())
        node.nlink -= 1
        self._maybe_free(node)
        parent.mtime = parent.ctime = node.ctime = self.clock()
        return node

    def hold(self, node: MemNode) -> None:
        """A descriptor or stream now refers to ``node``."""
        node.holders += 1

    def release(self, node: MemNode) -> None:
        """A descriptor or stream on ``node`` is gone."""
        node.holders -= 1
        self._maybe_free(node)

    def _maybe_free(self, node: MemNode) -> None:
        if node.nlink == 0 and node.holders == 0:
            self.used -= len(node.data)
            node.data = bytearray()

    @contextmanager
    def resolve(self, base: MemNode, path: str) -> Iterator[tuple[MemNode, str]]:
        """``(directory, name)`` for ``path`` beneath ``base``, with the rules of _paths.resolve."""
        stack: list[MemNode] = [base]
        name = "."
        parts = split_path(path)
        for i, part in enumerate(parts):
            if part == "..":
                if len(stack) == 1:
                    raise FsError("not-permitted", "path climbs out of its directory")
                stack.pop()
                name = "."
                continue
            if i == len(parts) - 1:
                name = part
                break
            children = stack[-1].children
            assert children is not None
            child = children.get(part)
            if child is None:
                raise FsError("no-entry", part)
            if not child.is_dir:
                raise FsError("not-directory", part)
            stack.append(child)
        if name != "." and dir_only(path):
            node = (stack[-1].children or {}).get(name)
            if node is not None and not node.is_dir:
                raise FsError("not-directory", f"{name!r} is not a directory")
        yield stack[-1], name

    @staticmethod
    def lookup(parent: MemNode, name: str) -> MemNode:
        """The node ``name`` in ``parent`` (``.`` is ``parent``), or ``no-entry``."""
        if name == ".":
            return parent
        assert parent.children is not None
        node = parent.children.get(name)
        if node is None:
            raise FsError("no-entry", name)
        return node
