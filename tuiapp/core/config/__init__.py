"""Recipes: the TOML schema, hosts, reward functions, sweeps (and their records) and experiment trackers."""
