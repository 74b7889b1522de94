"""A test agent that talks: log() at every level, print() to stdout and stderr."""

import sys

from mighty_agent import Agent, export, log, on


class Chatty(Agent):
    said: int = 0

    def setup(self, init):
        log("chatty is up", "info")

    @on("talk")
    def talk(self, body, sender):
        self.said += 1
        log(f"debug detail {self.said}", "debug")
        log(f"talking {self.said}")
        log("something odd", "warning")
        print(f"printed {self.said}")
        print("to stderr", file=sys.stderr)
        print("two\nlines")
        return {"said": self.said}

    @on("spam")
    def spam(self, body, sender):
        for i in range(body["n"]):
            print(f"line {i}")
        return


WitWorld = export(Chatty)
