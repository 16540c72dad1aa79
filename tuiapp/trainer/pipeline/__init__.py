"""`launch.strategy = "pipeline"` inside the ranks: the training loop (runner), the model cut into
stages (stage) and their checkpoints (checkpoints: saved per stage, merged into one HF model).
Nothing is imported here: export reads checkpoints without loading torch's pipelining."""
