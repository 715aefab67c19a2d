"""Textual screens: the log viewer, the patch screen, help, and the confirmation dialog."""
