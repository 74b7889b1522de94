"""A durable agent whose message makes HTTP requests, for the crash-point state machine."""

from mighty_agent import Agent, export, http, on


class Fetcher(Agent):
    base: str = ""
    done: int = 0

    def setup(self, init):
        self.base = (init or {})["base"]

    @on("work")
    def work(self, body, sender):
        for step in (1, 2, 3):
            response = http.post(f"{self.base}/effect", json={"step": step}, timeout=600)
            if response.status != 200:
                raise RuntimeError(f"effect {step}: {response.status}")
        self.done += 1
        return self.done

    @on("status")
    def status(self, body, sender):
        return self.done


WitWorld = export(Fetcher)
