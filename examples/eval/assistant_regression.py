"""A regression of assistant.py: it asks the model the same thing but garbles the answer."""

from mighty_agent import Agent, ask, export, on


class Assistant(Agent):
    answered: int = 0

    @on("question")
    def question(self, body, sender):
        city = body["city"]
        reply = ask("model", "complete", {"prompt": f"Weather in {city}, in five words?"})
        self.answered += 1
        return {"city": city, "answer": reply["text"].split(",")[0]}  # drops half the answer


WitWorld = export(Assistant)
