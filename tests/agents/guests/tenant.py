"""An agent for tests/agents/test_seats.py: it reports what a reused instance must not carry over
from the agent it served before (module state, the address, output, the ``random`` sequence)."""

import random
import time

from mighty_agent import Agent, export, log, on, self_address

SEEN = []  # module state: never the agent's own, and never another agent's


class Tenant(Agent):
    name: str = ""

    @on("plant")
    def plant(self, body, sender):
        SEEN.append(body)
        self.name = body
        print(f"planted {body} in {self_address()}")
        log(f"log of {body}")
        return {"seen": list(SEEN)}

    @on("look")
    def look(self, body, sender):
        return {
            "seen": list(SEEN),
            "me": self_address(),
            "name": self.name,
            "roll": random.random(),
        }

    @on("nap")
    def nap(self, body, sender):
        time.sleep(0.001)  # waits on a pollable: the guest is given a host resource
        return {"napped": True}


WitWorld = export(Tenant)
