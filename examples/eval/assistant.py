"""The assistant under test: asks the "model" agent, then answers the question it was sent.

In the recorded run (`app.toml`) the model is `model.py`; in `mty eval` its answers come from
the trace, so evaluating a new assistant build asks no model at all.
"""

from mighty_agent import Agent, ask, export, on


class Assistant(Agent):
    answered: int = 0

    @on("question")
    def question(self, body, sender):
        city = body["city"]
        reply = ask("model", "complete", {"prompt": f"Weather in {city}, in five words?"})
        self.answered += 1
        return {"city": city, "answer": reply["text"]}


WitWorld = export(Assistant)
