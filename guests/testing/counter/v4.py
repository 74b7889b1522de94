"""Counter v4: compatible schema, but its restore crashes the instance (a swap must roll back)."""

from mighty_agent import Agent, export, on


class Counter(Agent):
    count: int = 0
    increments: int = 0
    note: str = ""

    def __setattr__(self, name, value):
        if name == "count" and value > 0:
            import sys

            sys.setrecursionlimit(10**6)

            def down(n):
                return down(n + 1) + 1

            down(0)  # a trap, as a real bug in restore would be
        object.__setattr__(self, name, value)

    @on("get")
    def get(self, body, sender):
        return {"count": self.count, "version": 4}


WitWorld = export(Counter)
