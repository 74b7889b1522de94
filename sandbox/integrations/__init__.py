"""Adapters that plug ``mighty.sandbox`` into agent frameworks (each an optional extra).

- :mod:`mighty.sandbox.integrations.pydantic_ai`: a pydantic-ai toolset with one ``run_code``
  tool (extra ``pydantic-ai``).
"""

__all__: list[str] = []
