"""A run's lifecycle on the host, Slurm jobs included: its directory and records, launch,
the supervisor shim and restart supervisor, pace, divergence, timeline, history, kill.
Imports `remote.base` only, never the agent (`remote.agent` calls into it)."""
