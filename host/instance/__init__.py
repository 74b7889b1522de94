"""The instance layer: a component instantiated in its own store and called under budgets."""

from mighty.instance._instance import Instance, call_once, default_gate

__all__ = ["Instance", "call_once", "default_gate"]
