"""The host side of eagle3-tui: the agent and its sibling modules, uploaded as files and run
by the host's own Python (>= 3.9, standard library only). See docs/architecture.md."""
