"""`python -m tui.cli`: the same entry point as the `eagle3-tui` script."""

from tui.cli.main import main

main()
