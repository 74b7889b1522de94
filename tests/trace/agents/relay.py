"""A relay agent for the debugger's tests: `relay` asks the next agent of `via` to relay the
rest and answers with what came back, so a -> b -> c is an ask chain three agents deep. Each
agent counts what it relayed and replies with its count: the state the live agent had."""

from mighty_agent import Agent, ask, export, on, self_address


class Relay(Agent):
    relayed: int = 0
    seen: list = None

    @on("relay")
    def relay(self, body, sender):
        self.relayed += 1
        self.seen = (self.seen or []) + [body["tag"]]
        via = body.get("via") or []
        below = None
        if via:
            below = ask(via[0], "relay", {"via": via[1:], "tag": body["tag"]})
        return {"by": self_address(), "relayed": self.relayed, "seen": self.seen, "below": below}


WitWorld = export(Relay)
