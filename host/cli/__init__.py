"""The `mty` command line."""

from mighty.cli._cache import cache_command
from mighty.cli._capabilities import capabilities_command
from mighty.cli._debug import trace_export_command
from mighty.cli._eval import eval_command
from mighty.cli._history import fork_command, history_command
from mighty.cli._inspect import compile_command, inspect_command
from mighty.cli._main import main, parse_size
from mighty.cli._mcp import sandbox_group
from mighty.cli._node import migrate_command, node_command
from mighty.cli._observe import inspect_agents_command, top_command
from mighty.cli._run import reload_command, run_command
from mighty.cli._sandbox import exec_command
from mighty.cli._send import ask_command, send_command
from mighty.cli._serve import serve_command

# Commands living in their own modules join the group here, once `main` exists.
main.add_command(exec_command, "exec")
main.add_command(sandbox_group, "sandbox")
main.add_command(run_command, "run")
main.add_command(reload_command, "reload")
main.add_command(node_command, "node")
main.add_command(migrate_command, "migrate")
main.add_command(compile_command, "compile")
main.add_command(inspect_command, "inspect-component")
main.add_command(inspect_command, "wit")
main.add_command(eval_command, "eval")
main.add_command(inspect_agents_command, "inspect")
main.add_command(top_command, "top")
main.add_command(send_command, "send")
main.add_command(ask_command, "ask")
main.add_command(cache_command, "cache")
main.add_command(capabilities_command, "capabilities")
main.commands["trace"].add_command(trace_export_command, "export")  # type: ignore[attr-defined]
main.add_command(serve_command, "serve")
main.add_command(history_command, "history")
main.add_command(fork_command, "fork")

__all__ = ["main", "parse_size"]
