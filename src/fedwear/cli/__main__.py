"""``python -m fedwear.cli``."""

from fedwear.cli import main

main()
