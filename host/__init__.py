"""mighty: run handlers compiled to WebAssembly components under hard budgets."""
