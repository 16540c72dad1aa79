"""What a launch will be: ranks and nodes, SLURM, the memory estimate, pipeline stages, the probe, the model's profile, a generation server."""
