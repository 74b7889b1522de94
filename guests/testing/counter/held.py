"""Counter v1, whose slow handler waits on the host instead of burning a guessed amount of CPU.

Same state and messages as examples/agents/counter.py (v1), except ``work``: it logs ``working``
and returns. The log is a host call made inside the turn, so a test whose ``on_event`` blocks on
that event holds the handler running for exactly as long as it needs (a swap meeting it past its
drain deadline), on a machine of any speed and load. Rejected: a loop of a fixed length, which
outlasted the swap's own checks on a quiet machine and not on a loaded one.
"""

from mighty_agent import Agent, export, log, on


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
        log("working")  # the host holds the turn here until its test lets it go
        return {"done": True}


WitWorld = export(Counter)
