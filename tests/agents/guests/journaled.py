"""A durable agent whose message makes tool calls, for the crash-recovery tests."""

from mighty_agent import Agent, export, on, tools


class Worker(Agent):
    done: int = 0

    @on("work")
    def work(self, body, sender):
        for step in (1, 2, 3):
            tools.count(step=step)
        tools.pause()
        tools.count(step=4)
        self.done += 1
        return self.done

    @on("status")
    def status(self, body, sender):
        return self.done


WitWorld = export(Worker)
