"""A test agent for traces and events: asks (or tells) the next agent of a path, emits, logs."""

from mighty_agent import Agent, ask, emit, export, log, on, send


class Relay(Agent):
    hops: int = 0

    @on("relay")
    def relay(self, body, sender):
        self.hops += 1
        path = body.get("path", [])
        emit("hop", {"left": len(path), "hops": self.hops})
        log(f"relaying, {len(path)} left", "info")
        if not path:
            return {"depth": 0}
        reply = ask(path[0], "relay", {"path": path[1:]})
        return {"depth": reply["depth"] + 1}

    @on("tell")
    def tell(self, body, sender):
        path = body.get("path", [])
        if path:
            send(path[0], "tell", {"path": path[1:]})
        return


WitWorld = export(Relay)
