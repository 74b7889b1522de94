"""An agent that does what each message asks, to test grants: call a tool, spawn, send, ask."""

from mighty_agent import Agent, AgentError, ask, export, on, send, spawn, tools


class Probe(Agent):
    @on("call")
    def call(self, body, sender):
        try:
            return {"ok": tools.call(body["tool"], *body.get("args", []), **body.get("kwargs", {}))}
        except tools.ToolError as exc:
            return {"error": exc.kind, "message": exc.message}

    @on("names")
    def names(self, body, sender):
        return tools.names()

    @on("spawn")
    def spawn_one(self, body, sender):
        try:
            return {"ok": spawn(body["type"], None)}
        except AgentError as exc:
            return {"error": type(exc).__name__, "message": str(exc)}

    @on("send")
    def send_one(self, body, sender):
        try:
            send(body["to"], "ping", None)
            return {"ok": True}
        except AgentError as exc:
            return {"error": type(exc).__name__, "message": str(exc)}

    @on("ask")
    def ask_one(self, body, sender):
        try:
            return {"ok": ask(body["to"], body.get("name", "ping"), None, timeout=10)}
        except AgentError as exc:
            return {"error": type(exc).__name__, "message": str(exc)}

    @on("ping")
    def ping(self, body, sender):
        return "pong"


WitWorld = export(Probe)
