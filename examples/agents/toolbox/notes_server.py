"""An MCP server someone else wrote: notes on disk, served over stdio with the `mcp` SDK.

The runtime starts it once (`[capabilities.notes]` in mighty.toml), lists its tools and routes
the calls of every agent granted them.
"""

from pathlib import Path

from mcp.server import MCPServer

app = MCPServer("notes")
NOTES = Path(__file__).with_name("notes")


@app.tool()
def read(name: str) -> str:
    """The text of note `name`."""
    path = NOTES / Path(name).name
    if not path.is_file():
        raise ValueError(f"no note named {name}")
    return path.read_text()


@app.tool()
def listing() -> list[str]:
    """The names of the notes."""
    return sorted(p.name for p in NOTES.iterdir())


@app.tool()
def write(name: str, text: str) -> int:
    """Write note `name`; returns the characters written."""
    NOTES.mkdir(exist_ok=True)
    return (NOTES / Path(name).name).write_text(text)


if __name__ == "__main__":
    app.run("stdio")
