"""Raises while being imported, from a helper: the build must point at the helper's line."""

import wit_world

from _broken_helper import load_config

CONFIG = load_config()


class WitWorld(wit_world.WitWorld):
    def run(self) -> str:
        return str(CONFIG)

    def twice(self, n: int) -> int:
        return 2 * n
