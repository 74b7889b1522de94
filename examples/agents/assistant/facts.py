"""A small agent holding facts: `lookup` answers a topic from its table (the assistant's tool)."""

from mighty_agent import Agent, export, on

FACTS = {
    "capital of France": "Paris",
    "capital of Norway": "Oslo",
    "boiling point of water at sea level": "100 degrees Celsius",
}


class Facts(Agent):
    facts: dict = None
    lookups: int = 0

    def setup(self, init):
        # The built-in table, with whatever the manifest's `init` adds or overrides.
        self.facts = {**FACTS, **(init or {})}

    @on("lookup")
    def lookup(self, body, sender):
        topic = body["topic"]
        self.lookups += 1
        key = next((k for k in self.facts if k.lower() == topic.strip().lower()), None)
        if key is None:
            return {"topic": topic, "found": False, "fact": None}
        return {"topic": topic, "found": True, "fact": self.facts[key]}


WitWorld = export(Facts)
