"""Defines no WitWorld class at all."""

import wit_world  # noqa: F401


def run() -> str:
    return "not a method"
