"""The instance layer: a component instantiated in its own store and called under budgets."""

from mighty.instance._instance import Instance, call_once, default_gate
from mighty.instance._recording import Recording, RecordSink

__all__ = ["Instance", "RecordSink", "Recording", "call_once", "default_gate"]
