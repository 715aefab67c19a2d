"""The host side of eagle3-tui, in rooms by job: `base` (what every host part reads),
`run` (a run's lifecycle, Slurm jobs included), `agent` (the agent the client talks to),
and the extraction job (`extract.py` + `extraction/`, a separate program the user runs).
Uploaded as this package (`agent-<sha12>/remote/`) and run by the host's own Python
(>= 3.9, standard library only). Modules import each other through the package only
(`from remote.run import kill`); an entry point started as a file puts the directory
above the package first on sys.path. See docs/architecture.md, "Host files"."""
