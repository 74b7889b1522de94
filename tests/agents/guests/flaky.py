"""An agent whose "work" crashes it (its fuel runs out) until a host tool says it is the
attempt to succeed, for tests/agents/test_retry.py."""

from mighty_agent import Agent, export, on, tools


class Flaky(Agent):
    @on("work")
    def work(self, body, sender):
        attempt = tools.attempt()
        if attempt < body["ok_at"]:
            while True:  # burns the message's fuel: a crash, not a failure
                pass
        return attempt


WitWorld = export(Flaky)
