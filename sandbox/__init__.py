"""mighty.sandbox: code mode (untrusted Python in a fresh wasm interpreter per run)."""

__all__: list[str] = []
