"""The tools the generated programs may call (canned data: the recorded world of the case)."""

WEATHER = {
    "Paris": {"sky": "sunny", "celsius": 21},
    "Oslo": {"sky": "snowy", "celsius": -3},
}


def weather(city: str) -> dict:
    """Today's weather in a city."""
    return WEATHER.get(city, {"sky": "unknown", "celsius": None})


def flights(origin: str, destination: str) -> list:
    """Flights between two cities today."""
    return [{"flight": "MT 404", "departs": "09:15"}, {"flight": "MT 418", "departs": "17:40"}]
