"""An assistant that answers a question with a chat-completions model and a `lookup` tool.

It sends the question to `POST {base_url}/chat/completions` (OpenAI's API), offering one
function tool, `lookup`. When the model calls it, the assistant asks the `facts` agent and sends
the answer back as a `tool` message, until the model answers in words: that answer is the reply.

The base URL and the model come from the manifest's `init`; the API key never reaches this
code: the host adds the `Authorization` header to requests for the granted origin (the
manifest's `http` grant names the host's environment variable that holds it).
"""

import json

from mighty_agent import Agent, ask, export, http, log, on

SYSTEM = "You answer questions briefly. Use the lookup tool for facts; do not guess."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a fact up by topic, e.g. 'capital of France'.",
            "parameters": {
                "type": "object",
                "properties": {"topic": {"type": "string", "description": "what to look up"}},
                "required": ["topic"],
            },
        },
    }
]
MAX_TURNS = 8  # model round trips per question: a model that never stops calling tools is cut


class ModelError(Exception):
    """The chat-completions endpoint refused the request or answered something unreadable."""


class Assistant(Agent):
    base_url: str = ""
    model: str = ""
    facts: str = "facts"
    answered: int = 0

    def setup(self, init):
        init = init or {}
        self.base_url = init["base_url"].rstrip("/")
        self.model = init["model"]
        self.facts = init.get("facts", "facts")

    @on("question")
    def question(self, body, sender):
        question = body["question"]
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ]
        for _ in range(MAX_TURNS):
            message = self._complete(messages)
            calls = message.get("tool_calls") or []
            if not calls:
                self.answered += 1
                return {"question": question, "answer": message.get("content") or ""}
            messages.append(
                {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
            )
            for call in calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": self._run_tool(call)}
                )
        raise ModelError(f"no answer after {MAX_TURNS} model turns")

    @on("status")
    def status(self, body, sender):
        """How many questions this assistant has answered (durable.toml's README section)."""
        return {"answered": self.answered}

    def _complete(self, messages):
        """The model's next message for the conversation so far."""
        response = http.post(
            f"{self.base_url}/chat/completions",
            json={"model": self.model, "messages": messages, "tools": TOOLS},
            timeout=30,
        )
        if response.status != 200:
            raise ModelError(f"chat completions answered {response.status}: {response.text}")
        try:
            return response.json()["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ModelError(f"unreadable completion: {response.text[:200]}") from exc

    def _run_tool(self, call):
        """The text answer of one tool call, for a `tool` message."""
        function = call.get("function") or {}
        if function.get("name") != "lookup":
            return f"error: no tool named {function.get('name')!r}"
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            return "error: the arguments are not JSON"
        topic = arguments.get("topic", "")
        log(f"lookup {topic!r}")
        found = ask(self.facts, "lookup", {"topic": topic})
        return found["fact"] if found["found"] else f"nothing known about {topic!r}"


WitWorld = export(Assistant)
