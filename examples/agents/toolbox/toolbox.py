"""An agent that calls the tools it was granted: a host tool and an MCP server's tools."""

from mighty_agent import Agent, export, on, tools


class Toolbox(Agent):
    @on("plan")
    def plan(self, body, sender):
        """Read a note and the forecast, and answer with both."""
        note = tools.notes.read(name=body["note"])
        weather = tools.forecast(city=body["city"])
        return {"note": note, "weather": f"{weather['temp']} C, {weather['sky']}"}

    @on("save")
    def save(self, body, sender):
        """Try to write a note: this agent was granted reading only."""
        try:
            return tools.notes.write(name=body["note"], text=body["text"])
        except tools.ToolError as exc:
            return {"refused": exc.kind}

    @on("tools")
    def granted(self, body, sender):
        return tools.names()


WitWorld = export(Toolbox)
