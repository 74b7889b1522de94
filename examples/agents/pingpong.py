"""Ping-pong: a `pinger` asks a `ponger` N times and reports how many replies came back."""

from mighty_agent import Agent, ask, export, on, self_address


class PingPong(Agent):
    pings: int = 0
    pongs: int = 0

    @on("ping")
    def ping(self, body, sender):
        self.pings += 1
        return {"pong": body.get("n", 0), "by": self_address()}

    @on("start")
    def start(self, body, sender):
        peer, rounds = body["peer"], body.get("rounds", 3)
        timeout = body.get("timeout")  # None: as long as this message's own deadline allows
        for n in range(rounds):
            reply = ask(peer, "ping", {"n": n}, timeout=timeout)
            if reply["pong"] == n:
                self.pongs += 1
        return {"rounds": rounds, "pongs": self.pongs}


WitWorld = export(PingPong)
