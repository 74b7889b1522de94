"""Imports a module the guest does not have: the build must point at line 4."""

import wit_world
import no_such_module_xyz  # noqa: F401


class WitWorld(wit_world.WitWorld):
    def run(self) -> str:
        return "never"

    def twice(self, n: int) -> int:
        return 2 * n
