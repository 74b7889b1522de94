"""A durable agent whose message calls a counted tool N times (tests/cluster/test_journal_kill.py)."""

from mighty_agent import Agent, export, on, tools


class Steps(Agent):
    handled: int = 0
    results: list = []  # noqa: RUF012 - the agent's state: its annotated fields

    @on("run")
    def run(self, body, sender):
        got = [tools.step(i=i) for i in range(body["n"])]
        self.handled += 1
        self.results = self.results + got
        return {"handled": self.handled}

    @on("status")
    def status(self, body, sender):
        return {"handled": self.handled, "results": self.results}


WitWorld = export(Steps)
