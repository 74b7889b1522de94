# ruff: noqa: F821 - weather() and flights() are the tools the sandbox defines
# Another generation for the same request: other order, keyword arguments, other words.
options = flights(origin="Paris", destination="Oslo")
there = weather(city="Oslo")
here = weather(city="Paris")
pick = options[0]
result = (
    f"Fly from Paris to Oslo on {pick['flight']}, leaving at {pick['departs']}. "
    f"Paris is {here['sky']} while Oslo is {there['sky']}: bring a warm coat."
)
