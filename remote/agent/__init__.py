"""The agent the client talks to (`main.py`, started as a file), the agent inside a Slurm
job's step (`step.py`) and its follower (`node.py`), and the parts only the agent uses:
file operations, log following, the process table, action outcomes, the patch journal."""
