"""Textual widgets of the dashboard: GPU cards, tables, progress, status bar, log pane."""
