"""`python -m tui`: the eagle3-tui entry point."""

from tui.cli import main

main()
