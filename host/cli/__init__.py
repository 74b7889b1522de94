"""The `mty` command line."""

from mighty.cli._main import main, parse_size

__all__ = ["main", "parse_size"]
