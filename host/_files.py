"""Reading a file whose path came from untrusted input (a manifest, a trace, a control request).

One reader for every such path, so each gets the same checks: opened ``O_NONBLOCK`` (a FIFO
cannot block the open) and ``O_NOCTTY``; type and size checked with ``fstat`` on the open
descriptor before anything is read (a path swapped after the check is still the file checked);
the first bytes offered to a check before the rest is read (a huge file of something else costs
nothing); the read stopped at the limit plus one byte in case the file grows meanwhile.
Symlinks are followed (a build output is often one); what they lead to gets the same checks.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from mighty._errors import BadInput

__all__ = ["FileRefused", "read_regular_file"]

_CHUNK = 1 << 20


class FileRefused(BadInput):
    """A path names something other than a regular file this host will read."""

    kind = "bad_file"


def read_regular_file(
    path: str | os.PathLike[str],
    max_bytes: int,
    *,
    limit_text: str | None = None,
    size: int | None = None,
    head: Callable[[bytes], None] | None = None,
    head_size: int = 8,
) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``max_bytes``, else FileRefused.

    ``limit_text`` names the limit in the message (default ``"<max_bytes>-byte limit"``);
    ``size``, when given, is the size the file must have; ``head`` is called with the first
    ``head_size`` bytes before the rest is read, and raises to refuse the file.
    """
    name = os.fsdecode(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise FileRefused(f"cannot open {name}: no such file") from exc
    except OSError as exc:
        raise FileRefused(f"cannot open {name}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"{name} is {_describe(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            limit = limit_text or f"{max_bytes}-byte limit"
            raise FileRefused(f"{name} is {info.st_size} bytes, over the {limit}")
        if size is not None and info.st_size != size:
            raise FileRefused(f"{name} is {info.st_size} bytes, not the expected {size}")
        first = b""
        if head is not None:
            first = _read_up_to(fd, head_size)
            head(first)
        data = first + _read_up_to(fd, max_bytes + 1 - len(first))
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise FileRefused(f"{name} grew past the {limit_text or f'{max_bytes}-byte limit'}")
    return data


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"
