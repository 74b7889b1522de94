"""Word count as a pipeline of agents: read -> tokenize -> count.

One component plays every role; the manifest decides which agent does what:
- `reader` reads a text file through a read-only preopen and returns its lines;
- `tokenizer` turns a line into lowercase words;
- `counter` keeps running totals (its state) and answers `top`;
- `driver` runs the pipeline with asks and sends.
"""

import re

from mighty_agent import Agent, ask, export, on, send

_WORD = re.compile(r"[a-z']+")


class WordCount(Agent):
    counts: dict = None
    lines_seen: int = 0

    def setup(self, init):
        self.counts = {}

    @on("read")
    def read(self, body, sender):
        with open(body["path"], encoding="utf-8") as f:
            return f.read().splitlines()

    @on("tokenize")
    def tokenize(self, body, sender):
        return _WORD.findall(body.lower())

    @on("count")
    def count(self, body, sender):
        self.lines_seen += 1
        for word in body:
            self.counts[word] = self.counts.get(word, 0) + 1

    @on("top")
    def top(self, body, sender):
        n = (body or {}).get("n", 5)
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return {"lines": self.lines_seen, "top": ranked}

    @on("run")
    def run(self, body, sender):
        lines = ask("reader", "read", {"path": body["path"]})
        for line in lines:
            send("counter", "count", ask("tokenizer", "tokenize", line))
        return ask("counter", "top", {"n": body.get("n", 5)})


WitWorld = export(WordCount)
