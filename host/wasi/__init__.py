"""WASI 0.2 implemented in Python behind the gate, driven by a frozen Policy."""

from mighty.wasi._policy import DEFAULT_OUTPUT_CAP, DirGrant, MemoryDir, OutputPolicy, Policy

__all__ = ["DEFAULT_OUTPUT_CAP", "DirGrant", "MemoryDir", "OutputPolicy", "Policy"]
