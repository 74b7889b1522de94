"""A counter whose code can be replaced while it runs (`mty reload counter --from v2.wasm`).

Its state is the annotated fields; `snapshot`/`restore` carry them across a hot swap, and a new
version may add fields (with defaults) or remove them; the host refuses incompatible changes.
"""

from mighty_agent import Agent, export, on


class Counter(Agent):
    count: int = 0

    @on("incr")
    def incr(self, body, sender):
        self.count += (body or {}).get("by", 1)
        return {"count": self.count, "version": 1}

    @on("get")
    def get(self, body, sender):
        return {"count": self.count, "version": 1}

    @on("work")
    def work(self, body, sender):
        # Busy for a while (a slow handler, to show a swap waiting for it or giving up).
        total = 0
        for i in range((body or {}).get("n", 1000)):
            total += i
        return {"done": True}


WitWorld = export(Counter)
