"""A helper that fails when called at import time."""


def load_config() -> dict[str, int]:
    settings = {"retries": 3}
    return {"timeout": settings["timeout"]}
