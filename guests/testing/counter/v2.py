"""Counter v2: adds a field with a default (compatible with v1)."""

from mighty_agent import Agent, export, on


class Counter(Agent):
    count: int = 0
    increments: int = 0

    @on("incr")
    def incr(self, body, sender):
        self.count += (body or {}).get("by", 1)
        self.increments += 1
        return {"count": self.count, "version": 2}

    @on("get")
    def get(self, body, sender):
        return {"count": self.count, "increments": self.increments, "version": 2}


WitWorld = export(Counter)
