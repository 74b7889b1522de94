"""A harmless refactor of assistant.py: the same questions and answers, other code (and fuel)."""

from mighty_agent import Agent, ask, export, on

PROMPT = "Weather in {city}, in five words?"


def complete(prompt: str) -> str:
    return str(ask("model", "complete", {"prompt": prompt})["text"])


class Assistant(Agent):
    answered: int = 0

    @on("question")
    def question(self, body, sender):
        city = str(body.get("city"))
        answer = complete(PROMPT.format(city=city))
        self.answered = self.answered + 1
        return {"answer": answer, "city": city}


WitWorld = export(Assistant)
