"""A durable agent whose message has side effects: reserve, charge, ship (docs/durability.md)."""

from mighty_agent import Agent, export, on, tools


class Orders(Agent):
    shipped: int = 0

    @on("order")
    def order(self, body, sender):
        item = body["item"]
        tools.reserve(item=item)
        tools.charge(item=item, cents=body["cents"])
        tools.ship(item=item)
        self.shipped += 1
        return {"shipped": self.shipped}

    @on("status")
    def status(self, body, sender):
        return {"shipped": self.shipped}


WitWorld = export(Orders)
