"""Tests of `mty sandbox serve`, code mode's MCP server."""
