"""eagle3-tui: supervise long-running GPU runs on a remote host over SSH."""

__version__ = "0.1.0"
