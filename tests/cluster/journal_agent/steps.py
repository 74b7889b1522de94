"""A durable agent whose `run` calls a counted tool N times, whose `fetch` POSTs N times and
whose `crash` traps (tests/cluster/test_journal_*.py)."""

from mighty_agent import Agent, export, http, on, tools


class Steps(Agent):
    handled: int = 0
    results: list = []  # noqa: RUF012 - the agent's state: its annotated fields

    @on("run")
    def run(self, body, sender):
        got = [tools.step(i=i) for i in range(body["n"])]
        self.handled += 1
        self.results = self.results + got
        return {"handled": self.handled}

    @on("fetch")
    def fetch(self, body, sender):
        got = []
        for i in range(body["n"]):
            response = http.post(body["url"], json={"i": i}, timeout=60)
            got.append(response.json()["answer"])
        self.handled += 1
        self.results = self.results + got
        return {"handled": self.handled}

    @on("crash")
    def crash(self, body, sender):
        # A trap (the stack runs out), not an exception: the agent crashes on this message.
        import sys

        sys.setrecursionlimit(10**6)

        def down(n):
            return down(n + 1) + 1

        return down(0)

    @on("status")
    def status(self, body, sender):
        return {"handled": self.handled, "results": self.results}


WitWorld = export(Steps)
