"""A reworded prompt for `mty eval`: the recorded assistant with another system message, so its
first request is one the recorded run never made (`diverged`, naming that request)."""

import assistant
from mighty_agent import export

SYSTEM = "Answer in one short sentence. Always use the lookup tool for facts."
assistant.SYSTEM = SYSTEM  # read by Assistant.question at each question

WitWorld = export(assistant.Assistant)
