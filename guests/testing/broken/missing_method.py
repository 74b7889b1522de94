"""Exports ``run`` but forgets ``twice``."""

import wit_world


class WitWorld(wit_world.WitWorld):
    def run(self) -> str:
        return "only one"
