"""What a guest may touch: frozen data with safe defaults. Nothing is granted unless listed.

A ``Policy`` is immutable; the ``with_*`` methods return changed copies, so one policy can be
shared by many instances and threads, and a trace can record exactly the policy a run had.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from mighty._errors import BadInput
from mighty.wasi._http_policy import HttpGrant, HttpPolicy, Origin, Secret

__all__ = [
    "DEFAULT_MAX_OPEN",
    "DEFAULT_OUTPUT_CAP",
    "DirGrant",
    "MemoryDir",
    "OutputPolicy",
    "Policy",
]

DEFAULT_OUTPUT_CAP = 1 << 20
DEFAULT_MAX_OPEN = 256
"""Descriptors (files, directories, streams, listings) one guest may hold open at once."""

ClockMode = Literal["real", "fixed", "virtual"]


@dataclass(frozen=True, slots=True)
class OutputPolicy:
    """Where one output stream (stdout or stderr) goes.

    Captured into memory up to ``cap`` bytes (the rest is counted, not kept, and the capture is
    marked truncated). Who else hears it as it is written is not policy but the embedder's:
    ``Instance(slots=[STDOUT_SINK.of(fn)])`` (mighty.wasi).
    """

    cap: int = DEFAULT_OUTPUT_CAP

    def __post_init__(self) -> None:
        if self.cap < 0:
            raise BadInput(f"output cap must be >= 0, got {self.cap}")


@dataclass(frozen=True, slots=True)
class DirGrant:
    """A host directory preopened for the guest at ``guest`` (an absolute guest path)."""

    host: Path
    guest: str
    readonly: bool = True
    max_bytes: int | None = None
    """Bytes the guest may write into this grant over the instance's life (writes, growth by
    ``set-size``, and ``ENTRY_COST`` per file, directory or link it creates); past it writes
    fail with ``insufficient-space``. A budget of bytes written, not of disk use: deleting or
    shrinking gives nothing back. None: no quota (the host's disk is the limit)."""

    def __post_init__(self) -> None:
        if not self.guest.startswith("/"):
            raise BadInput(f"guest path must be absolute, got {self.guest!r}")
        if "\x00" in self.guest or "\x00" in str(self.host):
            raise BadInput("paths must not contain NUL")
        if self.max_bytes is not None and (type(self.max_bytes) is not int or self.max_bytes < 0):
            raise BadInput(f"max_bytes must be None or an int >= 0, got {self.max_bytes!r}")


@dataclass(frozen=True, slots=True)
class MemoryDir:
    """An in-memory directory preopened at ``guest``, seeded with ``files`` (relative path ->
    bytes); the guest's writes stay in memory and vanish with the instance."""

    guest: str
    files: Mapping[str, bytes] = field(default_factory=dict)
    readonly: bool = False
    max_bytes: int = 64 << 20
    """Total bytes the guest may store in it."""

    def __post_init__(self) -> None:
        if not self.guest.startswith("/"):
            raise BadInput(f"guest path must be absolute, got {self.guest!r}")


@dataclass(frozen=True, slots=True)
class Policy:
    """Everything a guest may see of the outside world. The default grants nothing.

    - ``env``, ``args``: exactly these, nothing inherited from the host.
    - ``stdin``: these bytes, then end of file.
    - ``stdout``, ``stderr``: captured with a cap, optionally streamed to a sink.
    - ``clock``: ``real`` (the host's clocks), ``fixed`` (always ``clock_start``), or ``virtual``
      (starts at ``clock_start`` and advances deterministically with the guest's fuel).
    - ``seed``: ``None`` for OS entropy, or an int for a deterministic generator.
    - ``dirs``: preopened directories; paths always resolve inside their root.
    - ``network``: sockets are refused unless True (and even then, not implemented yet).
    - ``max_open``: descriptors the guest may hold at once; more opens fail with ``quota``.
    - ``http``: the origins ``wasi:http`` may reach, the secrets injected, the limits
      (see :mod:`mighty.wasi._http_policy`); nothing by default.
    """

    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    stdin: bytes = b""
    stdout: OutputPolicy = OutputPolicy()
    stderr: OutputPolicy = OutputPolicy()
    clock: ClockMode = "real"
    clock_start: int = 1_700_000_000 * 10**9
    """Wall-clock nanoseconds since the epoch at which fixed and virtual clocks start."""
    seed: int | None = None
    dirs: tuple[DirGrant | MemoryDir, ...] = ()
    network: bool = False
    max_read: int = 1 << 20
    """The most bytes one read or random call returns, whatever length the guest asks for."""
    max_open: int = DEFAULT_MAX_OPEN
    """Descriptors, streams on files and directory listings the guest may hold open at once.
    Each host one costs the process a file descriptor, which is shared with the host's own
    traces, sockets and tools; an open past it fails with ``quota`` (WASI 0.2 has no EMFILE)."""
    http: HttpPolicy = field(default_factory=HttpPolicy)

    def __post_init__(self) -> None:
        if self.clock not in ("real", "fixed", "virtual"):
            raise BadInput(f"clock must be real, fixed or virtual, got {self.clock!r}")
        for key, value in self.env:
            if "=" in key or "\x00" in key or "\x00" in value:
                raise BadInput(f"invalid environment variable {key!r}")
        guests = [d.guest for d in self.dirs]
        if len(set(guests)) != len(guests):
            raise BadInput(f"two directories preopened at the same guest path: {guests}")
        if self.max_read <= 0:
            raise BadInput("max_read must be positive")
        if type(self.max_open) is not int or self.max_open <= 0:
            raise BadInput(f"max_open must be a positive int, got {self.max_open!r}")

    def with_env(self, **env: str) -> Policy:
        """A copy with these environment variables added (or replaced)."""
        merged = dict(self.env)
        merged.update(env)
        return replace(self, env=tuple(merged.items()))

    def with_args(self, *args: str) -> Policy:
        return replace(self, args=tuple(args))

    def with_stdin(self, data: bytes) -> Policy:
        return replace(self, stdin=bytes(data))

    def with_dir(
        self,
        host: str | Path,
        guest: str,
        *,
        readonly: bool = True,
        max_bytes: int | None = None,
    ) -> Policy:
        """A copy with ``host`` preopened at ``guest`` (``max_bytes``: its write quota)."""
        grant = DirGrant(Path(host), guest, readonly, max_bytes)
        return replace(self, dirs=(*self.dirs, grant))

    def with_memory_dir(self, guest: str, files: Mapping[str, bytes] | None = None) -> Policy:
        return replace(self, dirs=(*self.dirs, MemoryDir(guest, dict(files or {}))))

    def with_clock(self, mode: ClockMode, start: int | None = None) -> Policy:
        return replace(self, clock=mode, clock_start=self.clock_start if start is None else start)

    def with_seed(self, seed: int | None) -> Policy:
        return replace(self, seed=seed)

    def with_http(
        self,
        origin: str | Origin,
        *,
        methods: Sequence[str] | None = None,
        secrets: Sequence[Secret] = (),
        allow_private: bool = False,
    ) -> Policy:
        """A copy that may reach ``origin`` (``https://api.example.com``, ``https://*.x.org:*``)
        over wasi:http, with ``secrets`` injected as headers into each of its requests."""
        parsed = origin if isinstance(origin, Origin) else Origin.parse(origin)
        grant = HttpGrant(
            parsed,
            None if methods is None else tuple(m.upper() for m in methods),
            tuple(secrets),
            allow_private,
        )
        return replace(self, http=replace(self.http, grants=(*self.http.grants, grant)))

    def with_http_limits(self, **limits: int | float) -> Policy:
        """A copy with these :class:`HttpLimits` fields changed."""
        changed = replace(self.http.limits, **limits)  # type: ignore[arg-type]
        return replace(self, http=replace(self.http, limits=changed))

    def replace(self, **changes: object) -> Policy:
        """A copy with the given fields changed (validated like the original)."""
        return replace(self, **changes)  # type: ignore[arg-type]
