"""A stand-in "model" for the recorded run: canned completions. `mty eval` never runs it."""

from mighty_agent import Agent, export, on

ANSWERS = {
    "Paris": "Sunny, 21 degrees, light wind",
    "Oslo": "Cold, grey, snow this evening",
    "Lima": "Mild, overcast, dry all day",
}


class Model(Agent):
    @on("complete")
    def complete(self, body, sender):
        prompt = body["prompt"]
        city = prompt.removeprefix("Weather in ").split(",")[0]
        return {"text": ANSWERS.get(city, "No idea")}


WitWorld = export(Model)
