"""Compile Python handlers into WebAssembly components with componentize-py, with a build cache."""

from mighty.build._build import DEFAULT_TIMEOUT, BuildResult, ComponentizeError, build_component
from mighty.build._check import ExportNameClash, HandlerSyntaxError

__all__ = [
    "DEFAULT_TIMEOUT",
    "BuildResult",
    "ComponentizeError",
    "ExportNameClash",
    "HandlerSyntaxError",
    "build_component",
]
