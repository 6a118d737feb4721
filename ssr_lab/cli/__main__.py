"""``python -m ssr_lab.cli``."""

from ssr_lab.cli import main

main()
