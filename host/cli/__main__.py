"""`python -m mighty.cli` is `mty`."""

from mighty.cli import main

main()
