"""A test agent that passes an ask down a chain of agents; the last one spins."""

from mighty_agent import Agent, ask, export, http, on


class Relay(Agent):
    spun: int = 0

    @on("relay")
    def relay(self, body, sender):
        hops = body.get("to") or []
        if hops:
            return ask(hops[0], "relay", {"to": hops[1:], "n": body["n"]}, timeout=body.get("t"))
        total = 0
        for i in range(body["n"]):
            total += i
        self.spun += 1
        return {"total": total, "spun": self.spun}

    @on("fetch")
    def fetch(self, body, sender):
        return http.get(body["url"], timeout=600).text()

    @on("get")
    def get(self, body, sender):
        return {"spun": self.spun}


WitWorld = export(Relay)
