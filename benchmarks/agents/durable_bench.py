"""The agent of bench_durable: `work` makes N clock reads (N imports), `hold` makes N reads and
then calls the `pause` tool (the benchmark kills the process there)."""

import time

from mighty_agent import Agent, export, on, tools


class Bench(Agent):
    done: int = 0

    @on("work")
    def work(self, body, sender):
        total = 0.0
        for _ in range(body["imports"]):
            total += time.time()
        self.done += 1
        return self.done

    @on("hold")
    def hold(self, body, sender):
        for _ in range(body["imports"]):
            time.time()
        tools.pause()
        self.done += 1
        return self.done

    @on("status")
    def status(self, body, sender):
        return self.done


WitWorld = export(Bench)
