# ruff: noqa: F821 - weather() and flights() are the tools the sandbox defines
# A worse generation: it never looks at Oslo's weather and answers something else.
trip = flights("Paris", "Oslo")
here = weather("Paris")
result = "The museum opens at ten; tickets are cheaper online."
