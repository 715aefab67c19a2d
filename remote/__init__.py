"""The host side of eagle3-tui: the agent and its sibling modules, uploaded as this package
(`agent-<sha12>/remote/`) and run by the host's own Python (>= 3.9, standard library
only). Siblings import each other through the package only (`from remote import x`); an
entry point started as a file puts the directory above the package on sys.path first.
See docs/architecture.md, "Host files"."""
