"""The agent of benchmarks/bench_positions.py: `work` makes `n` imports (log lines)."""

from mighty_agent import Agent, export, log, on


class Bench(Agent):
    @on("work")
    def work(self, body, sender):
        n = body["n"]
        for _ in range(n):
            log("x")
        return {"n": n}


WitWorld = export(Bench)
