"""The benchmark agent of bench_capabilities: calls one granted tool N times in one message.

A loop inside one message keeps the ask's own cost out of the per-call figure (the benchmark
also times n=0 and subtracts it).
"""

from mighty_agent import Agent, export, on, tools


class ToolLoop(Agent):
    @on("loop")
    def loop(self, body, sender):
        """Call tool ``body["tool"]`` with ``body["args"]`` ``body["n"]`` times; the last result."""
        call = tools.call
        name, args = body["tool"], body["args"]
        result = None
        for _ in range(body["n"]):
            result = call(name, **args)
        return result


WitWorld = export(ToolLoop)
