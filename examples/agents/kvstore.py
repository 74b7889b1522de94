"""A key-value store agent, and a way to crash it on purpose.

`put`/`get`/`delete`/`size` do what they say. `crash` makes the guest trap (as a bug would);
its supervisor starts it again with a fresh instance and the same mailbox. The store keeps its
data in memory only, so a crash loses the data but never the messages still queued.
"""

from mighty_agent import Agent, export, log, on


class KvStore(Agent):
    data: dict = None

    def setup(self, init):
        self.data = dict(init or {})
        log(f"started with {len(self.data)} key(s)")

    @on("put")
    def put(self, body, sender):
        self.data[body["key"]] = body["value"]
        log(f"put {body['key']!r}", level="debug")
        return {"ok": True}

    @on("get")
    def get(self, body, sender):
        return {"value": self.data.get(body["key"])}

    @on("delete")
    def delete(self, body, sender):
        return {"deleted": self.data.pop(body["key"], None) is not None}

    @on("size")
    def size(self, body, sender):
        return {"size": len(self.data)}

    @on("crash")
    def crash(self, body, sender):
        log("crashing on purpose", level="warning")
        # A trap, not an exception: the whole agent goes down, as with a real bug.
        import sys

        sys.setrecursionlimit(10**6)

        def down(n):
            return down(n + 1) + 1

        return down(0)


WitWorld = export(KvStore)
