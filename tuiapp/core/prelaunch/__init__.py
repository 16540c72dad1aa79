"""Every check before a launch: recipe, model, cluster, methods, preference and RL, vision."""
