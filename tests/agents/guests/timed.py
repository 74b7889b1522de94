"""An agent that sets timers to itself, for tests/agents/test_timers.py."""

from mighty_agent import Agent, Refused, cancel_timer, export, on, self_address, send_after


class Timed(Agent):
    ticks: int = 0
    timer: int = 0

    @on("start")
    def start(self, body, sender):
        self.timer = send_after(
            body["delay"], self_address(), "tick", {"by": 1}, every=body.get("every")
        )
        return self.timer

    @on("start_to")
    def start_to(self, body, sender):
        try:
            return send_after(body["delay"], body["to"], "tick", None)
        except Refused as err:
            return {"refused": str(err)}

    @on("tick")
    def tick(self, body, sender):
        self.ticks += body["by"]

    @on("count")
    def count(self, body, sender):
        return self.ticks

    @on("stop")
    def stop(self, body, sender):
        return cancel_timer(self.timer)


WitWorld = export(Timed)
