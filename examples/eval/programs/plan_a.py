# ruff: noqa: F821 - weather() and flights() are the tools the sandbox defines
# The program a model wrote for "plan my trip from Paris to Oslo" (recorded as the baseline).
paris = weather("Paris")
oslo = weather("Oslo")
trip = flights("Paris", "Oslo")
first = trip[0]
result = (
    f"Take flight {first['flight']} at {first['departs']} from Paris to Oslo. "
    f"It is {paris['sky']} in Paris and {oslo['sky']} in Oslo, so pack a warm coat."
)
