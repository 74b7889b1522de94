"""A host tool: an ordinary Python function the agent calls as `tools.forecast(...)`.

It runs in the host process (so it may use the host's database, network and secrets); the
agent sees only its arguments and its result, both JSON, validated against the signature.
"""

_TABLE = {"oslo": (-3, "snow"), "lisbon": (17, "sun"), "lima": (22, "cloud")}


def forecast(city: str, days: int = 1) -> dict[str, object]:
    """Tomorrow's forecast for a city: temperature in Celsius and the sky."""
    if days < 1 or days > 7:
        raise ValueError("days must be 1 to 7")
    temp, sky = _TABLE.get(city.lower(), (10, "unknown"))
    return {"city": city, "days": days, "temp": temp, "sky": sky}
