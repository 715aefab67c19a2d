"""The extraction job's parts (`remote/extract.py` is its entry point: a separate program
the user runs, not the agent): errors and progress lines, input, output files and their
zip layout, the two backends, the preflight. Imports `remote.base` only from the host side."""
