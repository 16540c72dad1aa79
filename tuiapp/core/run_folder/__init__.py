"""The run folder as a protocol: its file names and run.json record, metrics and their columns, tails, progress, what a run shows, evals and exports records, RL generations."""
