"""The agent behind the HTTP front's tests: a key-value store, an echo, a handler error, a
trap, and a message that waits in a host tool until the test lets it go."""

from mighty_agent import Agent, export, on, tools


class Front(Agent):
    data: dict = None

    def setup(self, init):
        self.data = {}

    @on("put")
    def put(self, body, sender):
        self.data[body["key"]] = body["value"]
        return {"ok": True, "key": body["key"]}

    @on("get")
    def get(self, body, sender):
        return {"key": body["key"], "value": self.data.get(body["key"])}

    @on("echo")
    def echo(self, body, sender):
        return {"got": body}

    @on("fail")
    def fail(self, body, sender):
        raise LookupError("no such order")

    @on("crash")
    def crash(self, body, sender):
        import sys

        sys.setrecursionlimit(10**6)

        def down(n):
            return down(n + 1) + 1

        return down(0)

    @on("hold")
    def hold(self, body, sender):
        return tools.gate(name=(body or {}).get("name", "held"))

    @on("quiet")
    def quiet(self, body, sender):
        return None


WitWorld = export(Front)
