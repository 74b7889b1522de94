"""The instance layer: a component instantiated in its own store and called under budgets."""

from mighty.instance._instance import DEFAULT_OUTPUT_CAP, Instance, OutputBuffer, call_once

__all__ = ["DEFAULT_OUTPUT_CAP", "Instance", "OutputBuffer", "call_once"]
