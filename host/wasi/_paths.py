"""Resolving guest paths beneath a directory descriptor, so that no path ever leaves it.

Design: a path is split into components, checked (no NUL, not absolute, bounded length) and
then walked one component at a time from the base descriptor's fd with
``openat(parent, name, O_PATH | O_DIRECTORY | O_NOFOLLOW)``. The walk keeps the fds of every
directory it descended through on a stack; ``..`` pops that stack (it never asks the kernel
for the on-disk parent), and popping the base itself is ``not-permitted``. The kernel never
follows a symlink for us: a symlink met on the way is read with ``readlinkat`` and its target's
components are spliced into the walk, so they pass the same checks (an absolute target is
``not-permitted``, a target climbing above the base is ``not-permitted``, more than
``MAX_SYMLINKS`` expansions is ``loop``). The last component is followed only when the caller
asks (``path-flags.symlink-follow``). What the walk returns is a directory fd and one plain
name; the operation then acts on that name with ``O_NOFOLLOW`` / ``AT_SYMLINK_NOFOLLOW``
semantics, so a component swapped for a symlink after the walk fails (``loop``) instead of
being followed out of the root.

Symlink choice: symlinks that stay beneath the base are followed (intermediate components
always, the last one with ``symlink-follow``), as the WASI path-resolution rules describe;
anything else is refused. Guests may create symlinks in writable grants (``symlink-at``), with
targets that :func:`link_target_ok` accepts; whoever made a link, following it is this walk,
so a link's text can never take a path out of its base (absolute, climbing, swapped between
calls, pointing into another grant: each is ``not-permitted`` when followed).

Trailing slashes: ``"file/"`` names ``file`` only if it is a directory (POSIX), so the walk
follows a last component that ends in ``/`` and a non-directory there is ``not-directory``
(:func:`dir_only` says which paths). Rejected: passing ``name/`` to the kernel, which follows a
symlink in that last component itself, beneath nobody's checks.

As the WIT says, the boundary is the *base descriptor*, not the preopen: ``../x`` relative to a
descriptor for ``/data/a`` is ``not-permitted`` even though ``/data/x`` is in the preopen.

Rejected:
- ``os.path.realpath`` + prefix check: checks one path and then uses another (a race), and
  follows symlinks out of the root on the way.
- ``openat2(RESOLVE_BENEATH)`` via ctypes: Linux >= 5.6 only, and the walk needs to exist as a
  fallback anyway; one implementation is easier to trust than two.
- Lexical ``normpath`` then one ``openat``: ``a/..`` where ``a`` is a symlink means something
  else on disk, and the kernel would follow intermediate symlinks.

Known limit: if a *host* process moves a directory the walk holds out of the root during the
walk, the rest of the walk happens where it moved to (openat2 has the same property).
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "MAX_DEPTH",
    "MAX_LINK_PARTS",
    "MAX_NAME",
    "MAX_PATH",
    "MAX_SYMLINKS",
    "FsError",
    "dir_only",
    "errno_code",
    "link_target_ok",
    "resolve",
    "resolve_depth",
    "split_path",
    "stays_beneath",
]

MAX_PATH = 4096
"""The longest path (in UTF-8 bytes) a guest may pass, like Linux's PATH_MAX."""
MAX_NAME = 255
"""The longest single component (in UTF-8 bytes), like NAME_MAX."""
MAX_DEPTH = 256
"""How deep below its base a walk may go (it holds one fd per level)."""
MAX_SYMLINKS = 40
"""Symlink expansions in one resolution before it is a ``loop`` (Linux's MAXSYMLINKS)."""
MAX_LINK_PARTS = 4096
"""Components symlink targets may add to one resolution before it is a ``loop``: 40 targets of
``a/..`` x 1,000 would otherwise cost 80,000 ``openat`` calls (0.13 s of host time) a call."""


class FsError(Exception):
    """A guest request refused with a WIT ``error-code`` (``code``)."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code


_ERRNO: dict[int, str] = {
    errno.EACCES: "access",
    errno.EAGAIN: "would-block",
    errno.EALREADY: "already",
    errno.EBADF: "bad-descriptor",
    errno.EBUSY: "busy",
    errno.EDEADLK: "deadlock",
    errno.EDQUOT: "quota",
    errno.EEXIST: "exist",
    errno.EFBIG: "file-too-large",
    errno.EILSEQ: "illegal-byte-sequence",
    errno.EINPROGRESS: "in-progress",
    errno.EINTR: "interrupted",
    errno.EINVAL: "invalid",
    errno.EIO: "io",
    errno.EISDIR: "is-directory",
    errno.ELOOP: "loop",
    errno.EMLINK: "too-many-links",
    errno.EMSGSIZE: "message-size",
    errno.ENAMETOOLONG: "name-too-long",
    errno.ENODEV: "no-device",
    errno.ENOENT: "no-entry",
    errno.ENOLCK: "no-lock",
    errno.ENOMEM: "insufficient-memory",
    errno.ENOSPC: "insufficient-space",
    errno.ENOTDIR: "not-directory",
    errno.ENOTEMPTY: "not-empty",
    errno.ENOTRECOVERABLE: "not-recoverable",
    errno.ENOTSUP: "unsupported",
    errno.EOPNOTSUPP: "unsupported",
    errno.ENOSYS: "unsupported",
    errno.ENOTTY: "no-tty",
    errno.ENXIO: "no-such-device",
    errno.EOVERFLOW: "overflow",
    errno.EPERM: "not-permitted",
    errno.EPIPE: "pipe",
    errno.EROFS: "read-only",
    errno.ESPIPE: "invalid-seek",
    errno.ETXTBSY: "text-file-busy",
    errno.EXDEV: "cross-device",
}


def errno_code(exc: OSError) -> str:
    """The WIT ``error-code`` for an OSError (``io`` for anything unlisted)."""
    return _ERRNO.get(exc.errno or 0, "io")


def split_path(path: str) -> list[str]:
    """The components of a guest path, without ``.`` and empty ones; ``..`` is kept.

    Refuses NUL (``invalid``), absolute paths (``not-permitted``), over-long paths or names
    (``name-too-long``) and the empty path (``no-entry``, as POSIX does).
    """
    if "\x00" in path:
        raise FsError("invalid", "path contains NUL")
    if path.startswith("/"):
        raise FsError("not-permitted", "absolute paths are not allowed")
    if path == "":
        raise FsError("no-entry", "empty path")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise FsError("illegal-byte-sequence", "path is not UTF-8") from None
    if size > MAX_PATH:
        raise FsError("name-too-long", f"path is {size} bytes")
    parts = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if len(part.encode("utf-8")) > MAX_NAME:
            raise FsError("name-too-long", "a path component is over 255 bytes")
        parts.append(part)
    return parts


def dir_only(path: str) -> bool:
    """Whether ``path`` ends in a slash (or ``/.``): its last component must be a directory."""
    stripped = path.rstrip("/")
    return stripped not in ("", ".") and path.endswith(("/", "/."))


def link_target_ok(depth: int, target: str) -> None:
    """Refuse (``FsError``) a target for a guest-made symlink in a directory ``depth`` below
    the base: NUL (``invalid``), empty (``no-entry``), absolute or climbing above the base
    (``not-permitted``), over-long (``name-too-long``). Following is checked again anyway;
    this keeps the link's text from naming anything outside (readlink shows only such links)."""
    if target == "":
        raise FsError("no-entry", "empty symbolic link target")
    if target.startswith("/"):
        raise FsError("not-permitted", "a symbolic link may not point to an absolute path")
    split_path(target)
    if not stays_beneath(depth, target):
        raise FsError("not-permitted", "a symbolic link may not point above its directory")


_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _link_target(parent: int, name: str) -> str | None:
    """The target of ``name`` if it is a symlink, else None."""
    try:
        return os.readlink(name, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise


def _link_parts(target: str) -> list[str]:
    """The components of a symlink's target, checked like a guest path."""
    if target.startswith("/"):
        raise FsError("not-permitted", "a symbolic link points to an absolute path")
    if target == "":
        raise FsError("no-entry", "empty symbolic link")
    try:
        return split_path(target)
    except FsError as exc:
        raise FsError(exc.code, f"symbolic link target: {exc}") from None


@contextmanager
def resolve(base: int, path: str, *, follow: bool) -> Iterator[tuple[int, str]]:
    """Yield ``(dir_fd, name)``: ``path`` resolved beneath the directory fd ``base``.

    ``name`` is one plain component inside ``dir_fd``, or ``"."`` when the path names a
    directory on the walk itself (``"."``, ``"a/.."``). The fd is valid inside the ``with``
    only. Raises :class:`FsError`; an OSError inside the ``with`` is translated too.
    """
    with resolve_depth(base, path, follow=follow) as (fd, name, _depth):
        yield fd, name


def stays_beneath(depth: int, target: str) -> bool:
    """Whether a symlink ``target`` read in a directory ``depth`` levels below the base stays
    beneath it (lexically: it is never followed, only shown)."""
    if target.startswith("/"):
        return False
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def _splice(queue: deque[str], target: str, links: list[int]) -> None:
    """Put a symlink's target in front of the rest of the walk; ``links`` counts the links
    followed and the components they added (``loop`` past MAX_SYMLINKS or MAX_LINK_PARTS)."""
    parts = _link_parts(target)
    links[0] += 1
    links[1] += len(parts)
    if links[0] > MAX_SYMLINKS:
        raise FsError("loop", "too many symbolic links")
    if links[1] > MAX_LINK_PARTS:
        raise FsError("loop", "symbolic links added too many path components")
    queue.extendleft(reversed(parts))


def _walked(parent: int, name: str, depth: int, path: str) -> tuple[int, str, int]:
    """The walk's result; ``not-directory`` if ``path`` ends in ``/`` and names a non-directory
    (an absent name passes: the operation decides what a missing one means)."""
    if name != "." and dir_only(path):
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return parent, name, depth
        if not stat.S_ISDIR(mode):
            raise FsError("not-directory", f"{name!r} is not a directory")
    return parent, name, depth


@contextmanager
def resolve_depth(base: int, path: str, *, follow: bool) -> Iterator[tuple[int, str, int]]:
    """:func:`resolve`, also yielding how many directories below ``base`` ``dir_fd`` is."""
    stack: list[int] = []
    try:
        queue = deque(split_path(path))
        links = [0, 0]
        name = "."
        while queue:
            part = queue.popleft()
            top = stack[-1] if stack else base
            if part == "..":
                if not stack:
                    raise FsError("not-permitted", "path climbs out of its directory")
                os.close(stack.pop())
                name = "."
                continue
            last = not queue
            # "x/" names what x leads to: a last component before a slash is always followed.
            if last and not follow and not dir_only(path):
                name = part
                break
            try:
                if last:
                    target = _link_target(top, part)
                    if target is None:
                        name = part
                        break
                else:
                    stack.append(os.open(part, _DIR_FLAGS, dir_fd=top))
                    if len(stack) > MAX_DEPTH:
                        raise FsError("name-too-long", "path is too deep")
                    continue
            except OSError as exc:
                if exc.errno == errno.ENOENT and last:
                    name = part
                    break
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise FsError(errno_code(exc), f"{part!r}: {exc.strerror}") from None
                target = _link_target(top, part)
                if target is None:
                    raise FsError(errno_code(exc), f"{part!r}: {exc.strerror}") from None
            # `part` is a symlink: walk its target in its place.
            _splice(queue, target, links)
            name = "."
        yield _walked(stack[-1] if stack else base, name, len(stack), path)
    except OSError as exc:
        raise FsError(errno_code(exc), exc.strerror or "") from None
    finally:
        for fd in stack:
            os.close(fd)
