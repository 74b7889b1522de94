"""Does not parse: the build must point at line 8."""

import wit_world


class WitWorld(wit_world.WitWorld):
    def run(self) -> str:
        return "unclosed(
