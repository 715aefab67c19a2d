"""Views: the Textual app (`app.py`, layout in `app.tcss`), its `screens/` and
`widgets/`. The only layer that imports Textual; it renders state and calls services."""
