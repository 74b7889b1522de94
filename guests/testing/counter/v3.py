"""Counter v3: changes `count` from int to str (incompatible with v1 and v2: refused)."""

from mighty_agent import Agent, export, on


class Counter(Agent):
    count: str = "0"

    @on("get")
    def get(self, body, sender):
        return {"count": self.count, "version": 3}


WitWorld = export(Counter)
